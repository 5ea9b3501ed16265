"""ruff and mypy as background jobs of the test session, read by test_lint: the type check
(about 30 s of one core on a fresh clone) overlaps the tests that wait on processes.

The session's main process (the xdist controller, or plain pytest) starts them once; each job
writes its output and, when it ends, its exit code into a directory named in an environment
variable that the workers inherit. A test_lint run without them starts its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIR_ENV = "FORGELM_TUI_LINT_JOBS"
COMMANDS = {
    "ruff": [sys.executable, "-m", "ruff", "check", "."],
    "mypy": [sys.executable, "-m", "mypy"],
}


def start_lint_jobs() -> Path:
    """Start every job (once per session); the directory their results go to."""
    if DIR_ENV in os.environ:
        return Path(os.environ[DIR_ENV])
    where = Path(tempfile.mkdtemp(prefix="forgelm-tui-lint-"))
    os.environ[DIR_ENV] = str(where)
    for name, command in COMMANDS.items():
        with (where / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        threading.Thread(target=_record_exit, args=(proc, where / f"{name}.rc"),
                         daemon=True).start()
    return where


def _record_exit(proc: subprocess.Popen[bytes], rc_file: Path) -> None:
    code = proc.wait()
    tmp = rc_file.with_suffix(".tmp")
    tmp.write_text(str(code))
    tmp.replace(rc_file)


def result(name: str, timeout: float) -> tuple[int, str]:
    """The job's exit code and output, waiting for it (with a deadline)."""
    where = start_lint_jobs()
    rc_file = where / f"{name}.rc"
    deadline = time.monotonic() + timeout
    while not rc_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} did not finish within {timeout} s")
        time.sleep(0.1)
    return int(rc_file.read_text()), (where / f"{name}.log").read_text(errors="replace")
