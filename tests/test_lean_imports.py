"""A headless run loads no OpenSSL (issue 19 point 4, RSS): asyncio is imported without its ssl
module (forgelm_tui/lean_asyncio.py) and nothing on the run path imports hashlib or secrets."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cli_env, rank_script

pytestmark = pytest.mark.timeout(60)

A_RUN_THEN_MODULES = textwrap.dedent("""
    import sys
    from forgelm_tui.cli import main
    code = main(["--no-tui", "--run-dir", sys.argv[1], "--nproc-per-node", "2", sys.argv[2], "0"])
    print(code, sorted(m for m in ("ssl", "_ssl", "hashlib", "_hashlib", "secrets")
                       if m in sys.modules))
    import ssl  # still there for whatever needs it later
    print(ssl.PROTOCOL_TLS_CLIENT is not None)
""")


def test_a_headless_run_loads_no_openssl(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", A_RUN_THEN_MODULES, str(tmp_path / "run"),
                           rank_script("exit_with.py")], capture_output=True, text=True,
                          timeout=50, cwd=tmp_path, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == ["0 []", "True"], proc.stdout + proc.stderr
