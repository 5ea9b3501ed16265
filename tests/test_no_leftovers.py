"""A SIGKILLed pytest worker leaves no process behind (issue 19 point 3; tests/worker_watchdog.py).

An inner pytest session, on one xdist worker, starts what tests start: a headless supervisor with
two ranks, one of which leaves a daemon in a session of its own, and a TUI supervisor with a rank
in a private tmux server. Once all of it runs, the worker is SIGKILLed mid-test: within seconds
no process carries the worker's token, and none of the pids it reported is alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import pid_alive, wait_for
from worker_watchdog import TOKEN_ENV, carrying

pytestmark = pytest.mark.timeout(120)
TESTS = Path(__file__).parent

INNER = textwrap.dedent('''
    import os, time
    from pathlib import Path
    from conftest import rank_script, ready_pids, start, wait_for

    def test_held_mid_run(tmp_path, term):
        out = Path(os.environ["LEFTOVERS_OUT"])
        marks = tmp_path / "marks"
        marks.mkdir()
        (tmp_path / "headless").mkdir()
        run = start(["--nproc-per-node", "2", rank_script("daemon.py"), str(marks), "setsid",
                     "0", "--stay"], tmp_path / "headless")
        wait_for(lambda: (marks / "daemon-1").exists(), 60, "the daemon")
        tui_marks = tmp_path / "tui-marks"
        tui_marks.mkdir()
        term.start(["--nproc-per-node", "1", rank_script("sleeper.py"), str(tui_marks)])
        ready_pids(tui_marks, 1)
        pids = [os.getpid(), run.proc.pid, int((marks / "daemon-1").read_text()),
                *ready_pids(tui_marks, 1)]
        (out / "pids.tmp").write_text(" ".join(map(str, pids)) + "\\n" + os.environ["TOKEN_ENV"])
        (out / "pids.tmp").replace(out / "pids")
        time.sleep(600)
'''.replace("TOKEN_ENV", TOKEN_ENV))


def test_a_sigkilled_pytest_worker_leaves_no_process(tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "test_inner.py").write_text(INNER)
    (tmp_path / "inner" / "pytest.ini").write_text("[pytest]\n")  # not the project's -n auto
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "LEFTOVERS_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-n", "1",
         "--max-worker-restart", "0", "-p", "no:cacheprovider", "--timeout", "100",
         str(tmp_path / "inner" / "test_inner.py")],
        cwd=tmp_path / "inner", env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (out / "pids").exists() or inner.poll() is not None, 90,
                 "the inner test to start everything")
        assert (out / "pids").exists(), inner.communicate(timeout=30)[0]
        pid_line, token = (out / "pids").read_text().split("\n")
        worker, supervisor, daemon, tui_rank = map(int, pid_line.split())
        marked = carrying(token)
        # the supervisor, its guardian and two ranks, the daemon, the tmux server, the shell in
        # its pane, the TUI supervisor, its guardian and its rank
        assert len(marked) >= 10 and {supervisor, daemon, tui_rank} <= set(marked), marked
        os.kill(worker, signal.SIGKILL)
        reported = (worker, supervisor, daemon, tui_rank)
        wait_for(lambda: not carrying(token) and not any(pid_alive(p) for p in reported), 15,
                 "every process the worker started to be gone")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(inner.pid, signal.SIGKILL)
        inner.communicate(timeout=30)
