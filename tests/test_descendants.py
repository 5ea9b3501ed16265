"""Processes a rank starts outside its process group end with the run (SPEC §4, issue 12 item 1).

Each rank leaves a daemon behind (tests/ranks/daemon.py): in its own session, double-forked,
through ``setsid -f``, ignoring SIGTERM, with an empty environment. After the supervisor exits,
however it ended, no process may carry this run's id or its supervisor's token for more than 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import pid_alive, rank_script, start, wait_for

from forgelm_tui.engine.descendants import (
    END_GRACE,
    KILL_WAIT,
    TOKEN_ENV,
    Descendants,
    env_value,
)
from forgelm_tui.engine.records import DescendantEnd, RankRecord

DAEMON = rank_script("daemon.py")
GONE_WITHIN = 2.0


def carrying(needles: list[bytes]) -> list[int]:
    """Live processes whose environment holds one of ``needles`` (``NAME=value``)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = b"\0" + handle.read()
        except OSError:
            continue
        if any(b"\0" + needle + b"\0" in environ + b"\0" for needle in needles) and pid_alive(
                int(name)):
            found.append(int(name))
    return found


class Daemons:
    """What a run's rank 1 reported: its run id, the token, its daemon's pid."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks

    def ready(self) -> None:
        wait_for(lambda: (self.marks / "env-1").exists(), 30, "rank 1's daemon to start")

    @property
    def needles(self) -> list[bytes]:
        run_id, token = (self.marks / "env-1").read_text().split("\n")[:2]
        return [f"TORCHELASTIC_RUN_ID={run_id}".encode(), f"{TOKEN_ENV}={token}".encode()]

    @property
    def pid(self) -> int:
        return int((self.marks / "daemon-1").read_text())

    def left(self) -> list[int]:
        return carrying(self.needles) + ([self.pid] if pid_alive(self.pid) else [])

    def assert_gone(self) -> None:
        """Nothing of the run is left within GONE_WITHIN of the supervisor's exit."""
        wait_for(lambda: not self.left(), GONE_WITHIN, "every descendant of the run to be gone")

    def kill_all(self) -> None:
        if not (self.marks / "env-1").exists():
            return
        for pid in carrying(self.needles) + ([self.pid] if (self.marks / "daemon-1").exists()
                                              else []):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def daemons(marks: Path) -> Iterator[Daemons]:
    """Whatever a failing test left behind is killed by the run's id and token."""
    found = Daemons(marks)
    try:
        yield found
    finally:
        found.kill_all()


def only_descendant(run_envelope: dict, pid: int) -> dict:
    entries = run_envelope["descendants"]
    assert [d["pid"] for d in entries] == [pid], entries
    return entries[0]


@pytest.mark.fault("F11")
@pytest.mark.parametrize("mode", ["session", "double", "setsid"])
def test_a_failing_rank_s_daemon_is_stopped_with_the_run(
        mode: str, tmp_path: Path, marks: Path, daemons: Daemons) -> None:
    run = start(["--nproc-per-node", "2", DAEMON, str(marks), mode, "7"], tmp_path)
    code = run.wait()
    out, _ = run.output()
    assert code == 2
    daemons.assert_gone()
    entry = only_descendant(run.envelope(), daemons.pid)
    assert entry["rank"] == 1
    assert entry["found_by"] == "environment"
    assert entry["ended"] == "sigterm"
    assert [s["signal"] for s in entry["signals"]] == ["SIGTERM"]
    assert entry["command"].startswith("python")
    assert "daemon.py --daemon" in entry["command"]
    assert f"rank 1's descendant pid {daemons.pid} (python" in out
    assert "stopped with SIGTERM" in out


@pytest.mark.fault("F12")
def test_a_daemon_that_ignores_sigterm_gets_sigkill(
        tmp_path: Path, marks: Path, daemons: Daemons) -> None:
    run = start(["--nproc-per-node", "2", DAEMON, str(marks), "session", "7", "--ignore-term"],
                tmp_path)
    assert run.wait() == 2
    out, _ = run.output()
    daemons.assert_gone()
    entry = only_descendant(run.envelope(), daemons.pid)
    assert entry["ended"] == "sigkill"
    assert [s["signal"] for s in entry["signals"]] == ["SIGTERM", "SIGKILL"]
    assert "killed with SIGKILL" in out


@pytest.mark.fault("F11")
def test_a_clean_success_stops_the_daemon_left_running(
        tmp_path: Path, marks: Path, daemons: Daemons) -> None:
    run = start(["--nproc-per-node", "2", DAEMON, str(marks), "session", "0"], tmp_path)
    assert run.wait() == 0
    daemons.assert_gone()
    envelope = run.envelope()
    assert envelope["exit_code"] == 0
    assert only_descendant(envelope, daemons.pid)["ended"] == "sigterm"


@pytest.mark.fault("F13")
def test_a_daemon_with_an_empty_environment_is_adopted_and_stopped(
        tmp_path: Path, marks: Path, daemons: Daemons) -> None:
    """No token to find it by: the supervisor is a child subreaper, the orphan is its child."""
    run = start(["--nproc-per-node", "2", DAEMON, str(marks), "double", "0", "--clean-env"],
                tmp_path)
    assert run.wait() == 0
    daemons.assert_gone()
    entry = only_descendant(run.envelope(), daemons.pid)
    assert entry["found_by"] == "adopted"
    assert entry["rank"] is None
    assert entry["ended"] == "sigterm"


@pytest.mark.fault("F11")
def test_a_cancel_stops_the_daemon_with_the_ranks(
        tmp_path: Path, marks: Path, daemons: Daemons) -> None:
    run = start(["--nproc-per-node", "2", DAEMON, str(marks), "setsid", "0", "--stay"],
                tmp_path)
    daemons.ready()
    run.signal(signal.SIGTERM)
    assert run.wait() == 2
    daemons.assert_gone()
    envelope = run.envelope()
    assert envelope["cancelled"] is not None
    entry = only_descendant(envelope, daemons.pid)
    assert entry["ended"] == "sigterm"
    assert len(entry["signals"]) == 1  # the stop's SIGTERM, in the pass over the rank groups


@pytest.mark.fault("F27")
@pytest.mark.parametrize("flags", [[], ["--ignore-term"]], ids=["plain", "ignores-sigterm"])
def test_the_guardian_stops_the_daemons_of_a_sigkilled_supervisor(
        flags: list[str], tmp_path: Path, marks: Path, daemons: Daemons) -> None:
    run = start(["--nproc-per-node", "2", DAEMON, str(marks), "double", "0", "--stay", *flags],
                tmp_path)
    daemons.ready()
    assert daemons.left()
    run.signal(signal.SIGKILL)
    run.wait()
    daemons.assert_gone()


def test_env_value_reads_one_variable() -> None:
    environ = b"A=1\0RANK=3\0XRANK=9\0"
    assert env_value(environ, "RANK") == "3"
    assert env_value(b"RANK=0\0", "RANK") == "0"
    assert env_value(environ, "MISSING") is None


def _marked_process(token: str, argv: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, TOKEN_ENV: token, "RANK": "5"}
    return subprocess.Popen(argv, env=env, start_new_session=True)


def test_the_scan_leaves_ranks_and_their_groups_and_records_who_exited() -> None:
    """In-process: a "rank" (a group leader with the token) and its child in its group are the
    group's business; a process in a session of its own is a descendant, and one that ended
    before any signal is recorded as ``exited``."""
    rank = RankRecord(0, 0, 0, "", "", "")
    descendants = Descendants({0: rank})
    group = _marked_process(descendants.token, ["sh", "-c", "sleep 30 & wait"])
    loner = _marked_process(descendants.token, [sys.executable, "-c",
                                                "import time; time.sleep(60)"])
    try:
        rank.pid = group.pid
        wait_for(lambda: len(carrying([f"{TOKEN_ENV}={descendants.token}".encode()])) >= 3, 10,
                 "the three marked processes")
        live = descendants._refresh()
        assert [d.pid for d in live] == [loner.pid]
        assert live[0].rank == 5
        assert live[0].found_by == "environment"
        assert live[0].command.startswith("python")
        loner.kill()
        loner.wait()
        assert descendants._refresh() == []
        assert descendants.found[loner.pid].ended is DescendantEnd.EXITED
    finally:
        for proc in (group, loner):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.fault("F11")
def test_the_end_stops_what_is_left_then_says_so(tmp_path: Path) -> None:
    """In-process, on a loop: SIGTERM, and SIGKILL for one that ignores it, within the bound."""
    descendants = Descendants({})
    ignoring = _marked_process(descendants.token, [
        sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f" open({str(tmp_path / 'ready')!r}, 'w').close(); time.sleep(60)"])
    plain = _marked_process(descendants.token, ["sleep", "60"])
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), 10, "the SIGTERM-ignoring process")

        async def end() -> float:
            done = asyncio.Event()
            began = time.monotonic()
            if descendants.stopping(done.set):
                await asyncio.wait_for(done.wait(), 10)
            return time.monotonic() - began

        took = asyncio.run(end())
        ignoring.wait(5)
        plain.wait(5)
        ended = {d.pid: d.ended for d in descendants.entries()}
        assert ended == {ignoring.pid: DescendantEnd.SIGKILL, plain.pid: DescendantEnd.SIGTERM}
        assert took < END_GRACE + KILL_WAIT + 0.5
        assert descendants.stopping(lambda: None) is False  # once over, it stays over
    finally:
        for proc in (ignoring, plain):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
