"""The descendant scan stays off the hot paths (issue 19 point 4): a stop's signal pass signals
only what is known and scans right after it; the end reads what the subreaper adopted instead of
scanning every process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import pid_alive, wait_for

from forgelm_tui.engine.descendants import TOKEN_ENV, Descendants, subtree

pytestmark = pytest.mark.timeout(60)


def _marked_sleeper(token: str) -> subprocess.Popen[bytes]:
    """A process in a session of its own carrying the token, once it carries it (exec'd)."""
    env = {**os.environ, TOKEN_ENV: token, "RANK": "3"}
    proc = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    wait_for(lambda: _command(proc.pid).startswith(b"sleep"), 10, "the sleeper's exec")
    return proc


def _command(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_stop_pass_signals_the_known_at_once_and_scans_after() -> None:
    descendants = Descendants({})
    known = _marked_sleeper(descendants.token)
    try:
        wait_for(lambda: [r.pid for r in descendants._refresh()] == [known.pid], 10,
                 "the first descendant to be found")
        new = _marked_sleeper(descendants.token)
        try:
            async def stop_pass() -> tuple[list[int], list[int]]:
                descendants.signal(signal.SIGTERM)
                during = sorted(descendants.found)  # the pass itself scanned nothing
                await asyncio.sleep(0)  # the loop's next turn: the scan after the pass
                return during, sorted(descendants.found)

            during, after = asyncio.run(stop_pass())
            assert during == [known.pid]
            assert after == sorted([known.pid, new.pid])
            for proc in (known, new):  # (the scan may reap them: this test is their parent)
                wait_for(lambda proc=proc: not pid_alive(proc.pid), 10, "the SIGTERM to land")
                assert [s for s, _ in descendants.found[proc.pid].signals] == [signal.SIGTERM]
        finally:
            with contextlib.suppress(ProcessLookupError):
                new.kill()
            new.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            known.kill()
        known.wait()


def test_subtree_walks_children_files() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        def sleeps() -> set[int]:
            kids = subtree({shell.pid}) - {shell.pid}
            return kids if all(_command(pid).startswith(b"sleep") for pid in kids) else set()

        wait_for(lambda: len(sleeps()) == 2, 10, "the shell's two sleeps")
        assert subtree(set()) == set()
        assert subtree({2 ** 22 + 7}) == {2 ** 22 + 7}  # a pid that does not exist: itself only
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()


# In a subprocess: it makes itself a child subreaper, which a pytest worker must not become.
END_WITHOUT_A_SCAN = textwrap.dedent("""
    import asyncio, os, signal, subprocess, sys, time
    from forgelm_tui.engine.descendants import Descendants
    from forgelm_tui.engine.guardian import Guardian

    guardian = Guardian()
    descendants = Descendants({}, guardian)
    # an adopted process (own session, no token) with a child of its own, as a daemon leaves them
    daemon = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True,
                              env={"PATH": os.environ["PATH"]})
    deadline = time.monotonic() + 10
    while not open(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read().split():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    listdir = os.listdir
    def no_scan(path="."):
        assert str(path) != "/proc", "the end scanned every process"
        return listdir(path)
    os.listdir = no_scan

    async def end():
        done = asyncio.Event()
        if descendants.stopping(done.set):
            await asyncio.wait_for(done.wait(), 10)
    asyncio.run(end())
    entries = descendants.entries()
    # the daemon first; its child, orphaned by the daemon's SIGTERM, is adopted and stopped too
    print([(e.pid == daemon.pid, e.found_by, e.ended.value) for e in entries])
    guardian.close()
""")


def test_the_end_reads_the_adopted_without_scanning_every_process() -> None:
    proc = subprocess.run([sys.executable, "-c", END_WITHOUT_A_SCAN], capture_output=True,
                          text=True, timeout=40)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("[(True, 'adopted', 'sigterm'), (False, 'adopted', 'sigterm')]"
                                   ), proc.stdout + proc.stderr
