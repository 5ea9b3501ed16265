"""The stop alarm (cluster/alarm.py, engine/early_stop.py; issue 23): another node's stop is
SIGTERMed one store round trip after it is published, before its record is read; the exits of
ranks that die of that pass wait for the record (read without it, they would look killed from
outside), or for RECORD_WAIT when it never comes. Real child processes, a real TCPStore on
127.0.0.1; the fan-out it shortens is measured by bench/scale.py (bench/RESULTS.md)."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import free_port_pair
from conftest import rank_record

import forgelm_tui.engine.early_stop as early_module
from forgelm_tui.cluster.alarm import alarm_thread
from forgelm_tui.cluster.store import Connections, ControlStore
from forgelm_tui.cluster.traffic import Traffic
from forgelm_tui.cluster.wire import stop_to_wire
from forgelm_tui.engine.early_stop import EarlyStop
from forgelm_tui.engine.events import Purpose
from forgelm_tui.engine.fanout import Fanout
from forgelm_tui.engine.records import RankRecord, StopRecord
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(60)
SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")


def stop(kind: StopKind = StopKind.FAILURE, node: int = 1) -> StopRecord:
    return StopRecord(kind, "rank 3 failed (exit 2)", "failure", None, time.time(), 0.0,
                      grace=5.0, origin_rank=3, origin_node=node)


# ---------------------------------------------------------------------- the pass, in process

def test_a_pass_without_its_record_holds_the_exits_it_caused_until_the_record_is_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    monkeypatch.setattr(early_module, "signal_group", lambda pid, sig: sent.append(pid) or True)
    monkeypatch.setattr(early_module, "_exited", lambda pid: False)
    read: list[tuple[int, int]] = []
    early = EarlyStop(read_exit=lambda record, code: read.append((record.rank, code)))
    records = [rank_record(r, pid=100 + r, started_mono=0.0) for r in range(2)]
    unsignalled = rank_record(2, pid=None)
    assert early.signal(None, [*records, unsignalled])  # the alarm's: the pass goes out now
    assert sent == [100, 101] and all(r.early_stop_at is not None for r in records)
    assert early.pending() is None  # no record yet
    assert early.hold(records[0], -signal.SIGTERM)  # died of it: held
    assert not early.hold(unsignalled, 1)  # not signalled by the pass: read at once
    assert read == []
    record = stop()
    assert not early.signal(record, records)  # the record: nothing sent again
    assert sent == [100, 101]
    assert not early.hold(records[1], -signal.SIGTERM)  # the record is in: read at once
    early.release()
    assert read == [(0, -signal.SIGTERM)] and early.pending() is record


def test_a_stop_pass_of_this_node_ends_the_wait_for_a_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """This node's own stop began after an alarm's pass (its own failure, a cancel): its exits
    are no longer held, and a record given late applies nothing."""
    monkeypatch.setattr(early_module, "signal_group", lambda pid, sig: True)
    monkeypatch.setattr(early_module, "_exited", lambda pid: False)
    early = EarlyStop()
    records = [rank_record(0, pid=100, started_mono=0.0)]
    assert early.signal(None, records)
    early.close()
    assert not early.hold(records[0], -signal.SIGTERM)
    assert not early.signal(stop(), records) and early.pending() is None
    assert EarlyStop().signal(None, [])  # nothing live: the pass still counts, once


def test_urgent_listeners_get_every_held_event_before_the_others_get_any() -> None:
    """The link publishes a stop from the event that says it began: before the views work
    through the events the stop pass held (measured at 32 x 8: 7 ms of view work first)."""
    seen: list[tuple[str, str]] = []
    fanout = Fanout(lambda exc, listener: None)
    fanout.listeners.append(lambda event: seen.append(("view", str(event))))
    fanout.urgent.append(lambda event: seen.append(("link", str(event))))
    with fanout.signals_first():
        fanout.emit("a")  # type: ignore[arg-type]
        fanout.emit("b")  # type: ignore[arg-type]
    assert seen == [("link", "a"), ("link", "b"), ("view", "a"), ("view", "b")]
    fanout.emit("c")  # type: ignore[arg-type]
    assert seen[-2:] == [("link", "c"), ("view", "c")]


# ---------------------------------------------------------------------- a supervisor's ranks

def supervisor(tmp_path: Path) -> Supervisor:
    spec = LaunchSpec(argv=SLEEP, run_id="r", run_dir=tmp_path, nproc_per_node=2,
                      master_addr="127.0.0.1", master_port=29999, grace=5.0, cwd=tmp_path)
    return Supervisor(spec, base_env={})


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def assert_collateral(sup: Supervisor, before: float) -> None:
    assert sup.stop is not None
    assert (sup.stop.kind, sup.stop.origin_node, sup.stop.origin_rank) == (StopKind.FAILURE, 1, 3)
    for rank in sup.records.values():
        stops = [s for s in rank.signals_sent if s.purpose.stops]
        assert [s.signal for s in stops] == [signal.SIGTERM], rank.signals_sent
        assert rank.ended_at is not None and before <= stops[0].at <= rank.ended_at
        assert rank.signal == signal.SIGTERM and rank.signalled_first
        assert not rank.ending().outside_death


async def test_ranks_dead_of_the_alarms_pass_are_read_once_its_record_came(
        tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    run = asyncio.create_task(sup.run())
    await until(lambda: all(r.pid for r in sup.records.values()))
    before = time.time()
    assert await asyncio.to_thread(sup.early_stop, None)  # the alarm thread's pass
    await asyncio.sleep(0.5)  # both die of it; their exits are held: no stop known yet
    assert sup.stop is None and all(r.ended_at is None for r in sup.records.values())
    await asyncio.to_thread(sup.early_stop, stop())  # the record, from the store
    sup.early_exits()  # as the alarm thread posts it
    await asyncio.wait_for(run, 30)
    assert_collateral(sup, before)


async def test_held_exits_are_read_after_the_record_wait_when_no_record_comes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store went away between the alarm and the record: the run still ends (its exits
    read as they are; the store's loss is its own stop on a real node)."""
    monkeypatch.setattr(early_module, "RECORD_WAIT", 0.3)
    sup = supervisor(tmp_path)
    run = asyncio.create_task(sup.run())
    await until(lambda: all(r.pid for r in sup.records.values()))
    assert await asyncio.to_thread(sup.early_stop, None)
    await asyncio.wait_for(run, 30)
    assert all(r.signal == signal.SIGTERM and r.signalled_first for r in sup.records.values())


async def test_held_exits_are_read_at_once_when_this_node_stops_on_its_own(
        tmp_path: Path) -> None:
    """The alarm's pass went out, then the store went away (no record): the node's own stop
    (node 0 lost) is applied and the held exits are read as its collateral, at once, not
    after RECORD_WAIT."""
    sup = supervisor(tmp_path)
    run = asyncio.create_task(sup.run())
    await until(lambda: all(r.pid for r in sup.records.values()))
    assert await asyncio.to_thread(sup.early_stop, None)
    await asyncio.sleep(0.5)  # both died of it, held
    lost = StopRecord(StopKind.NODE_LOST, "node 0 lost", "node 0", None, time.time(), 0.0,
                      grace=5.0, origin_node=1, lost_node=0)
    started = time.monotonic()
    sup.apply_stop(lost)
    await asyncio.wait_for(run, 30)
    assert time.monotonic() - started < early_module.RECORD_WAIT
    assert sup.stop is not None and sup.stop.kind is StopKind.NODE_LOST
    for rank in sup.records.values():
        assert [s.purpose for s in rank.signals_sent] == [Purpose.STOP]
        assert rank.signalled_first and not rank.ending().outside_death


# ---------------------------------------------------------------------- the alarm thread

@pytest.fixture
def store() -> Any:
    port = free_port_pair()
    host = ControlStore.host(port, 10.0)
    host.scoped("run-1")
    yield host, port


def connections(host: ControlStore, port: int) -> Connections:
    return Connections(host, [], "127.0.0.1", port, 10.0)


def test_a_wait_answers_at_a_set_and_times_out_quickly_when_none_comes(store: Any) -> None:
    host, port = store
    client = host.client("127.0.0.1", port, 10.0)
    started = time.monotonic()
    assert not client.wait_for("alarm", 0.2)
    assert time.monotonic() - started < 5.0
    threading.Timer(0.2, host.set, ("alarm", 1)).start()
    assert client.wait_for("alarm", 10.0)
    assert client.wait_for("alarm", 0.1)  # set: at once
    client.set("after", 2)  # the connection still answers in turn after a timed-out wait
    assert client.get("after") == 2


async def test_the_alarm_thread_stops_this_nodes_ranks_on_another_nodes_published_stop(
        tmp_path: Path, store: Any) -> None:
    host, port = store
    sup = supervisor(tmp_path)
    run = asyncio.create_task(sup.run())
    await until(lambda: all(r.pid for r in sup.records.values()))
    loop = asyncio.get_running_loop()
    closed = threading.Event()
    thread = threading.Thread(target=alarm_thread, args=(
        sup, connections(host, port), 0, closed,
        lambda callback: loop.call_soon_threadsafe(callback)), daemon=True)
    thread.start()
    before = time.time()
    wire = stop_to_wire(stop())
    await asyncio.to_thread(Traffic(1, 2).publish, host.client("127.0.0.1", port, 10.0),
                            "stop", wire)  # node 1's publisher: record, alarm, broadcast
    await asyncio.wait_for(run, 30)
    closed.set()
    await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive()
    assert_collateral(sup, before)


async def test_the_alarm_of_this_nodes_own_stop_sends_nothing(tmp_path: Path,
                                                              store: Any) -> None:
    host, port = store
    sup = supervisor(tmp_path)
    run = asyncio.create_task(sup.run())
    await until(lambda: all(r.pid for r in sup.records.values()))
    sup.request_cancel("operator", signal.SIGINT)  # this node's stop: its pass went out
    loop = asyncio.get_running_loop()
    posted: list[object] = []
    host.set("stop", stop_to_wire(stop(StopKind.CANCEL, node=0)))
    host.set("alarm", 1)
    await asyncio.to_thread(alarm_thread, sup, connections(host, port), 0, threading.Event(),
                            lambda callback: posted.append(callback) or loop.call_soon(callback))
    await asyncio.wait_for(run, 30)
    assert posted == []
    assert all([s.signal for s in r.signals_sent] == [signal.SIGTERM]
               for r in sup.records.values())


def test_a_closed_links_alarm_thread_ends_within_its_wait(store: Any, tmp_path: Path) -> None:
    host, port = store
    closed = threading.Event()
    sup = supervisor(tmp_path)
    thread = threading.Thread(target=alarm_thread, args=(
        sup, connections(host, port), 0, closed, lambda callback: None), daemon=True)
    thread.start()
    closed.set()
    thread.join(10)
    assert not thread.is_alive() and sup.stop is None


def _records(sup: Supervisor) -> list[RankRecord]:
    return list(sup.records.values())
