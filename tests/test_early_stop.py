"""Another node's stop, signalled by the thread that read it (engine/early_stop.py, issue 23):
SIGTERM to every live rank's group once, never after this node's own stop pass began, never
for a stall; the loop records those signals at the time they went out and sends none again; a
rank that died of one before the loop applied the stop is the stop's collateral. Real child
processes; the fan-out it shortens is bench/scale.py's (bench/RESULTS.md)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import rank_record, wait_for

from forgelm_tui.engine.early_stop import EarlyStop
from forgelm_tui.engine.events import Purpose
from forgelm_tui.engine.records import RankRecord, StopRecord
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(60)
SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")


def stop(kind: StopKind = StopKind.FAILURE) -> StopRecord:
    return StopRecord(kind, "rank 3 failed (exit 2) (on node 1)", "failure", None, time.time(),
                      0.0, grace=5.0, origin_rank=3, origin_node=1)


def children(count: int, argv: tuple[str, ...] = SLEEP) -> tuple[list[subprocess.Popen[bytes]],
                                                                   list[RankRecord]]:
    procs = [subprocess.Popen(argv, start_new_session=True) for _ in range(count)]
    return procs, [rank_record(r, pid=p.pid, started_mono=0.0) for r, p in enumerate(procs)]


def test_the_early_pass_signals_every_live_ranks_group_once() -> None:
    procs, records = children(2)
    early = EarlyStop()
    before = time.time()
    assert early.signal(stop(), records)
    assert [p.wait(10) for p in procs] == [-signal.SIGTERM] * 2
    assert not early.signal(stop(), records)  # once
    at = records[0].early_stop_at
    assert at is not None and before <= at <= time.time() and records[0].signalled_first
    assert early.pending() is not None and early.pending() is None


def test_a_rank_is_marked_signalled_before_its_signal_goes_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank a SIGTERM wakes may end, and the loop read its exit, before this thread runs
    again: at the moment the signal goes out the rank is already marked (before, a rank of a
    32 x 8 bench run died of the early SIGTERM with no signal in its record); a signal that
    finds nothing is unmarked."""
    import forgelm_tui.engine.early_stop as module

    procs, records = children(2)
    seen: list[float | None] = []

    def send(pid: int, sig: int) -> bool:
        record = next(r for r in records if r.pid == pid)
        seen.append(record.early_stop_at)  # what the loop would read now
        if record is records[1]:
            return False  # already gone
        os.killpg(pid, sig)
        return True

    monkeypatch.setattr(module, "signal_group", send)
    try:
        assert EarlyStop().signal(stop(), records)
        assert len(seen) == 2 and all(at is not None for at in seen)
        assert records[0].early_stop_at is not None and records[1].early_stop_at is None
        assert procs[0].wait(10) == -signal.SIGTERM
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_no_early_pass_once_this_nodes_stop_began_nor_for_a_stall() -> None:
    procs, records = children(1)
    try:
        assert not EarlyStop().signal(stop(StopKind.STALL), records)  # the stacks come first
        closed = EarlyStop()
        closed.close()
        assert not closed.signal(stop(), records)
        time.sleep(0.2)
        assert procs[0].poll() is None  # never signalled
    finally:
        procs[0].kill()
        procs[0].wait()


def test_a_rank_that_already_ended_is_not_signalled() -> None:
    procs, records = children(1, (sys.executable, "-c", "pass"))
    wait_for(lambda: os.waitid(os.P_PID, procs[0].pid,
                               os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None, 10, "its end")
    early = EarlyStop()
    assert early.signal(stop(), records)
    assert records[0].early_stop_at is None  # it ended on its own: its exit says how
    assert not records[0].signalled_first
    assert procs[0].wait(5) == 0


def test_a_ranks_own_report_of_an_early_signal_is_no_outside_stop() -> None:
    """The rank says it got SIGTERM (the graceful runner, Lightning's line) before the loop
    applied the stop that sent it: it was signalled, not stopped from outside."""
    from forgelm_tui.engine.progress import ProgressReader

    record = rank_record(0, pid=100, started_mono=0.0)
    record.early_stop_at = time.time()
    ProgressReader(lambda event: None).reported_stop(record, "SIGTERM", None)
    assert record.foreign_stop is False


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def supervisor(tmp_path: Path) -> Supervisor:
    spec = LaunchSpec(argv=SLEEP, run_id="r", run_dir=tmp_path, nproc_per_node=2,
                      master_addr="127.0.0.1", master_port=29999, grace=5.0, cwd=tmp_path)
    return Supervisor(spec, base_env={})


async def test_ranks_that_die_of_an_early_stop_are_its_collateral_signalled_once(
        tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    run = asyncio.create_task(sup.run())
    await until(lambda: all(r.pid for r in sup.records.values()))
    record = stop()
    before = time.time()
    assert await asyncio.to_thread(sup.early_stop, record)  # another thread, as the inbox's
    await asyncio.wait_for(run, 30)  # they die of it before the loop was told: it applies it
    assert sup.stop is not None
    assert (sup.stop.kind, sup.stop.origin_node, sup.stop.origin_rank) == (StopKind.FAILURE, 1, 3)
    for rank in sup.records.values():
        stops = [s for s in rank.signals_sent if s.purpose.stops]
        assert [s.signal for s in stops] == [signal.SIGTERM], rank.signals_sent
        assert rank.ended_at is not None and before <= stops[0].at <= rank.ended_at
        assert rank.signal == signal.SIGTERM and rank.signalled_first
        assert not rank.ending().outside_death
    sup.apply_stop(record)  # the loop's copy of the message, late: nothing more is sent
    assert all(len(r.signals_sent) == 1 for r in sup.records.values())


async def test_this_nodes_own_stop_pass_first_leaves_nothing_to_send_early(
        tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    run = asyncio.create_task(sup.run())
    await until(lambda: all(r.pid for r in sup.records.values()))
    sup.request_cancel("operator", signal.SIGINT)
    assert not await asyncio.to_thread(sup.early_stop, stop())
    await asyncio.wait_for(run, 30)
    assert sup.stop is not None and sup.stop.kind is StopKind.CANCEL
    assert all([s.signal for s in r.signals_sent] == [signal.SIGTERM]
               for r in sup.records.values())


RANK_0_FAILS_LEAVING_A_CHILD = """
import os, subprocess, sys, time
if os.environ["RANK"] == "0":
    subprocess.Popen(["sleep", "60"])  # in its group, alive after it (a data loader worker)
    time.sleep(0.3)
    sys.exit(2)
time.sleep(60)
"""


async def test_a_rank_that_failed_on_its_own_just_before_an_early_stop_is_the_root_cause(
        tmp_path: Path) -> None:
    """Rank 0 exits 2 on its own (a child of it lives on in its group); before the loop reads
    that exit, another node's stop is sent early: rank 0 (ended, not reaped) is not signalled,
    its exit is read before the pending stop is applied (whose pass would signal its group),
    and it is a failure of its own, never the stop's collateral."""
    spec = LaunchSpec(argv=(sys.executable, "-c", RANK_0_FAILS_LEAVING_A_CHILD),
                      run_id="r", run_dir=tmp_path, nproc_per_node=2, master_addr="127.0.0.1",
                      master_port=29999, grace=5.0, cwd=tmp_path)
    sup = Supervisor(spec, base_env={})
    run = asyncio.create_task(sup.run())
    await until(lambda: all(r.pid for r in sup.records.values()))
    first = sup.records[0]
    assert first.pid is not None
    deadline = time.monotonic() + 20
    while os.waitid(os.P_PID, first.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)  # the loop held: rank 0's exit is not read yet
    assert sup.early_stop(stop())  # as the inbox thread would, now
    await asyncio.wait_for(run, 30)
    assert first.exit_code == 2 and not first.signalled_first
    assert [s.purpose for s in first.signals_sent] == [Purpose.CLEANUP]  # its child, after it
    assert sup.records[1].signalled_first and sup.records[1].signal == signal.SIGTERM
