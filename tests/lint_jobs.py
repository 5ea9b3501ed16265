"""ruff and mypy as background jobs of the test session (started by conftest, read by
test_lint): the type check overlaps the tests that wait on processes."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOBS: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
COMMANDS = {
    "ruff": [sys.executable, "-m", "ruff", "check", "."],
    "mypy": [sys.executable, "-m", "mypy"],
}


def start_lint_jobs() -> None:
    for name, command in COMMANDS.items():
        if name not in JOBS:
            out = Path(tempfile.mkstemp(prefix=f"forgelm-tui-{name}-", suffix=".log")[1])
            with out.open("wb") as handle:
                proc = subprocess.Popen(command, cwd=ROOT, stdout=handle,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            JOBS[name] = (proc, out)


def result(name: str, timeout: float) -> tuple[int, str]:
    """The job's exit code and output, waiting for it (started now if it was not yet)."""
    start_lint_jobs()
    proc, out = JOBS[name]
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    text = out.read_text(errors="replace")
    out.unlink(missing_ok=True)
    return code, text
