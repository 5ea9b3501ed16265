"""The control plane's traffic rules (issue 23; docs/multinode.md, "What it costs"), in
process: a fake store that counts what each call carries, an injected clock. The real store's
bytes at N nodes are bench/scale.py's; 8 real supervisors: test_multinode.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from conftest import FakeClock, rank_record

from forgelm_tui.cluster.liveness import Liveness
from forgelm_tui.cluster.store import BroadcastReader, ControlStore
from forgelm_tui.cluster.summary import ClusterView, NodeBeat, summarise
from forgelm_tui.cluster.traffic import Poll, Traffic
from forgelm_tui.cluster.views import ViewReader, ViewWriter
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.codec import to_wire
from forgelm_tui.engine.events import NodeState, RankState
from forgelm_tui.engine.node_summary import EVERY_RANK, NOTHING, Watch
from forgelm_tui.engine.records import RankRecord

pytestmark = pytest.mark.timeout(30)

RUNNING, DONE = NodeState.RUNNING, NodeState.DONE


class FakeStore(ControlStore):
    """A dict with ControlStore's calls; what each call read and wrote, by key, in bytes."""

    def __init__(self) -> None:
        super().__init__(raw=None)
        self.data: dict[str, str] = {}
        self.queues: dict[str, list[str]] = {}
        self.reads: list[tuple[str, int]] = []  # (key, value bytes) per key read
        self.writes: list[tuple[str, int]] = []
        self.calls = 0

    def _read(self, name: str) -> Any:
        self.calls += 1
        text = self.data[name]
        self.reads.append((name, len(text)))
        return json.loads(text)

    def set(self, name: str, value: Any) -> None:
        self.calls += 1
        self.data[name] = json.dumps(value)
        self.writes.append((name, len(self.data[name])))

    def get(self, name: str) -> Any:
        return self._read(name)

    def wait_get(self, name: str, timeout: float) -> Any | None:
        return self._read(name) if name in self.data else None

    def first(self, name: str, value: Any) -> Any:
        if name not in self.data:
            self.set(name, value)
        return self._read(name)

    def has(self, names: Sequence[str]) -> bool:
        self.calls += 1
        self.reads.extend((n, 0) for n in names)
        return all(n in self.data for n in names)

    def many(self, names: Sequence[str]) -> list[Any]:
        self.calls -= len(names) - 1  # one call
        return [self._read(n) for n in names]

    def add(self, name: str, amount: int) -> int:
        self.calls += 1
        value = int(self.data.get(name, "0")) + amount
        self.data[name] = str(value)
        return value

    def push(self, queue: str, value: Any) -> None:
        self.calls += 1
        self.queues.setdefault(queue, []).append(json.dumps(value))
        self.writes.append((queue, len(self.queues[queue][-1])))

    def keys_read(self) -> set[str]:
        return {key.split("/")[0] for key, _ in self.reads}

    def forget(self) -> None:
        self.reads, self.writes, self.calls = [], [], 0


def records(count: int, metrics: int = 0, points: int = 0) -> list[RankRecord]:
    """``count`` live ranks, each with ``metrics`` metrics and a curve of ``points`` points."""
    found = []
    for rank in range(count):
        record = rank_record(rank, pid=1000 + rank, started_mono=0.0, step=points)
        record.last_progress_mono = 90.0
        record.collectives = {"0": 7 + rank % 2}
        for step in range(points):
            record.history.add(step, {f"metric_{m}": 1.0 / (step + 1) for m in range(metrics)})
        record.metrics = {f"metric_{m}": 0.5 for m in range(metrics)}
        found.append(record)
    return found


def beat(node: int, seq: int = 1, phase: NodeState = RUNNING, vseq: int = 0,
         live: int = 2, age: float | None = 1.0, rseq: int = 0) -> dict[str, Any]:
    return NodeBeat(node, phase, live, age, {"0": (7, 8)}).wire(seq, f"host-{node}", rseq, vseq)


def cluster_store(nnodes: int, views: bool = False) -> FakeStore:
    """A store in a running cluster: every node's beat, node 0's summary, views if any."""
    store = FakeStore()
    for node in range(nnodes):
        store.set(f"beat/{node}", beat(node, rseq=1 if views else 0, vseq=1 if views else 0))
        if views:
            store.set(f"row/{node}", {"type": "NodeChanged", "ranks": []})
            store.set(f"view/{node}", {"type": "NodeChanged", "ranks": []})
    liveness = Liveness(list(range(1, nnodes)), 10.0, 0.0)
    store.set("summary", summarise(1, NodeBeat(0, RUNNING, 1, 1.0, {}), liveness, 1.0, 0,
                                   stop=False, kill=False))
    store.forget()
    return store


# ---------------------------------------------------------------------- what a node reads


@pytest.mark.parametrize("nnodes", [2, 16, 128])
def test_a_headless_node_reads_only_node_0s_summary(nnodes: int) -> None:
    store = cluster_store(nnodes, views=True)
    traffic = Traffic(nnodes - 1, nnodes)
    for tick in range(4):
        got = poll(traffic, store, 100.0 + tick, known=False)
        assert got.summary is not None and got.beats == {} and got.views == {}
    assert store.keys_read() == {"summary"}
    # one check before it first exists, then one read a tick: the same at 2 or 128 nodes
    assert store.calls == 5
    traffic.publish(store, "beat", beat(nnodes - 1))
    assert [key for key, _ in store.writes] == [f"beat/{nnodes - 1}"]


def test_node_0_reads_every_beat_and_no_rank_details_while_nobody_views() -> None:
    store = cluster_store(8, views=True)
    traffic = Traffic(0, 8)
    got = poll(traffic, store, 100.0, known=False)
    assert sorted(got.beats) == list(range(1, 8)) and got.viewers == 0
    assert store.keys_read() == {"beat", "stop", "kill"}  # never row/, view/ nor final/
    store.forget()
    poll(traffic, store, 100.5)
    assert store.keys_read() == {"beat"} and store.calls == 2  # one multi-get, the viewers


def test_a_beat_is_the_same_size_whatever_the_ranks_and_their_metrics() -> None:
    sizes = {}
    for ranks, metrics, points in [(1, 0, 0), (8, 1, 10), (64, 12, 200)]:
        own = NodeBeat.of(3, RUNNING, records(ranks, metrics, points), now=100.0)
        sizes[ranks] = len(json.dumps(own.wire(123, "gpu-node-003", 45)))
    assert max(sizes.values()) - min(sizes.values()) <= 4, sizes  # digits of the live count
    assert max(sizes.values()) < 200


def test_node_0s_summary_is_the_same_size_at_2_and_128_nodes() -> None:
    sizes = []
    for nnodes in (2, 128):
        liveness = Liveness(list(range(1, nnodes)), 10.0, 0.0)
        for node in range(1, nnodes):
            liveness.beat(node, beat(node, age=float(node)), now=1.0)
        own = NodeBeat(0, RUNNING, 8, 0.5, {"0": (7, 8)})
        summary = summarise(9, own, liveness, 2.0, viewers=1, stop=False, kill=False)
        sizes.append(len(json.dumps(summary)))
    assert abs(sizes[0] - sizes[1]) <= 8, sizes


@pytest.mark.parametrize("nnodes", [2, 128])
def test_a_stop_reaches_every_node_in_the_same_few_calls_whatever_the_nodes(nnodes: int) -> None:
    store = cluster_store(nnodes)
    stop = {"kind": "failure", "origin_node": nnodes - 1}
    Traffic(nnodes - 1, nnodes).publish(store, "stop", stop)
    # first writer wins, the alarm, a numbered broadcast key, node 0's queue: 6 calls
    assert store.calls == 6 and store.data["alarm"] == "1"
    readers = [BroadcastReader(store) for _ in range(3)]
    assert all(r.read(0.1) == {"kind": "stop", "stop": stop} for r in readers)
    assert all(r.read(0.1) is None for r in readers)
    assert store.queues["inbox/0"] == [json.dumps({"kind": "stop", "stop": stop})]


def test_the_alarm_is_set_by_a_stop_that_won_and_is_not_a_stall() -> None:
    """Every node's alarm thread sends its SIGTERM pass on the alarm, before the record is
    read (cluster/alarm.py): a stall's stop (stacks first), an escalation, a stop that lost
    and a heartbeat set none."""
    for kind, payload, alarm in (("stop", {"kind": "stall"}, False),
                                 ("kill", {"reason": "x", "node": 1}, False),
                                 ("beat", {"seq": 1}, False), ("stop", {"kind": "cancel"}, True)):
        store = cluster_store(4)
        Traffic(1, 4).publish(store, kind, payload)
        assert ("alarm" in store.data) is alarm, kind
    store = cluster_store(4)
    Traffic(2, 4).publish(store, "stop", {"kind": "stall"})
    Traffic(1, 4).publish(store, "stop", {"kind": "failure"})  # lost to the stall's record
    assert "alarm" not in store.data


def test_a_second_stop_is_not_broadcast() -> None:
    store = cluster_store(4)
    Traffic(1, 4).publish(store, "stop", {"kind": "cancel"})
    Traffic(2, 4).publish(store, "stop", {"kind": "failure"})
    assert store.data["bcast/n"] == "1" and json.loads(store.data["stop"]) == {"kind": "cancel"}


def test_broadcasts_are_read_in_order_and_a_dead_writers_number_is_skipped() -> None:
    store = FakeStore()
    reader = BroadcastReader(store)
    assert reader.read(0.1) is None  # nothing yet
    store.broadcast({"kind": "stop"})
    store.add("bcast/n", 1)  # a writer took number 2 and died before writing it
    store.broadcast({"kind": "verdict"})
    assert reader.read(0.1) == {"kind": "stop"}
    got = [reader.read(0.1) for _ in range(BroadcastReader.SKIP_AFTER + 1)]
    assert got == [None] * BroadcastReader.SKIP_AFTER + [{"kind": "verdict"}]


# ---------------------------------------------------------------------- views


def poll(traffic: Traffic, store: FakeStore, now: float, watch: Watch = NOTHING,
         known: bool = True) -> Poll:
    return traffic.poll(store, now, watch, stop_known=known, kill_known=known)


def read_of(store: FakeStore, *kinds: str) -> list[str]:
    return [key for key, _ in store.reads if key.split("/")[0] in kinds]


def test_a_viewing_node_reads_the_view_of_the_nodes_it_opened_and_the_rows_of_the_others() -> None:
    store = cluster_store(4, views=True)
    traffic, watch = Traffic(2, 4), Watch(True, frozenset({1}))
    got = poll(traffic, store, 100.0, watch)
    assert store.data["viewers"] == "1"  # counted once, in node 0's next summary
    assert store.data["watch/1"] == "1" and "watch/0" not in store.data
    assert sorted(got.views) == [0, 1, 3]
    assert read_of(store, "row", "view") == ["row/0", "view/1", "row/3"]
    store.forget()
    assert poll(traffic, store, 100.5, watch).views == {}
    assert store.keys_read() == {"summary"}  # not due: no beat read either
    store.set("beat/1", beat(1, seq=2, rseq=2, vseq=2))  # node 1's ranks changed
    store.set("beat/3", beat(3, seq=2, rseq=2, vseq=1))  # node 3's row changed
    got = poll(traffic, store, 101.0, watch)
    assert sorted(got.views) == [1, 3] and got.views[1][0] is RUNNING
    assert read_of(store, "row", "view") == ["view/1", "row/3"]


def test_a_node_closed_is_read_from_its_row_again_and_one_opened_from_its_view() -> None:
    store = cluster_store(3, views=True)
    traffic = Traffic(0, 3)
    poll(traffic, store, 100.0, Watch(True, frozenset({1})))
    store.forget()
    poll(traffic, store, 101.0, Watch(True, frozenset({2})))  # 1 closed, 2 opened
    assert store.data["watch/1"] == "0" and store.data["watch/2"] == "1"
    # node 1's latest row, node 2's latest view at once (a node whose ranks no longer change
    # writes no other: closed and opened again, it is still shown)
    assert read_of(store, "row", "view") == ["row/1", "view/2"]
    store.forget()
    poll(traffic, store, 102.0, Watch(True, frozenset({2})))
    assert read_of(store, "row", "view") == []  # nothing new
    store.set("beat/2", beat(2, seq=2, rseq=1, vseq=2))  # its next one (with its curves)
    poll(traffic, store, 103.0, Watch(True, frozenset({2})))
    assert read_of(store, "row", "view") == ["view/2"]


def test_a_node_opened_before_it_wrote_any_view_is_read_from_its_first() -> None:
    store = cluster_store(2)  # no row, no view written yet: nobody viewed
    traffic = Traffic(0, 2)
    poll(traffic, store, 100.0, Watch(True, frozenset({1})))
    assert read_of(store, "row", "view") == []  # never a read of a key not written
    store.set("view/1", {"type": "NodeChanged", "ranks": []})
    store.set("beat/1", beat(1, seq=2, vseq=1))
    poll(traffic, store, 101.0, Watch(True, frozenset({1})))
    assert read_of(store, "row", "view") == ["view/1"]


def test_a_node_that_stops_viewing_is_uncounted_everywhere() -> None:
    store = cluster_store(3)
    traffic = Traffic(1, 3)
    poll(traffic, store, 100.0, EVERY_RANK)
    assert store.data["watch/0"] == store.data["watch/2"] == "1"
    poll(traffic, store, 101.0, NOTHING)
    assert store.data["viewers"] == store.data["watch/0"] == store.data["watch/2"] == "0"


def test_a_node_reads_who_opened_it_only_while_another_node_views_at_most_once_a_second() -> None:
    store = cluster_store(3)
    traffic = Traffic(2, 3)
    assert poll(traffic, store, 100.0).watchers is None
    assert "watch" not in store.keys_read() and store.calls == 2  # the summary, as before
    summary = json.loads(store.data["summary"])
    store.set("summary", {**summary, "seq": 2, "viewers": 1})
    store.add("watch/2", 1)
    assert poll(traffic, store, 101.0).watchers == 1
    assert poll(traffic, store, 101.5).watchers is None  # read again a second later
    assert poll(traffic, store, 102.0).watchers == 1


def test_a_row_is_written_while_anyone_views_and_a_view_while_someone_opened_the_node() -> None:
    writer, ranks = ViewWriter(1, "h1"), records(2, metrics=1, points=3)
    assert not writer.due(100.0, viewers=0)
    assert writer.due(100.0, viewers=1)
    assert [kind for kind, _ in writer.write(RUNNING, ranks, watchers=0)] == ["row"]
    assert not writer.due(100.5, viewers=1)  # at most once a second
    assert writer.due(101.0, viewers=1) and writer.write(RUNNING, ranks, watchers=0) == []
    written = dict(writer.write(RUNNING, ranks, watchers=1))  # opened: its view, unchanged row
    assert list(written) == ["view"] and (writer.rseq, writer.vseq) == (1, 1)
    ranks[0].step = 4
    written = dict(writer.write(RUNNING, ranks, watchers=1))
    assert list(written) == ["row", "view"] and writer.vseq == 2
    view, row = ViewReader.decode(written["view"]), ViewReader.decode(written["row"])
    assert view is not None and [s.step for s in view.ranks] == [4, 3] and view.complete
    assert row is not None and row.ranks == () and not row.complete  # nobody to read
    assert row.summary == view.summary and row.summary is not None
    assert row.summary.slowest == (1, 3, None) and row.summary.count(RankState.RUNNING) == 2


def test_a_row_is_the_same_size_for_8_ranks_or_64_and_carries_only_ranks_that_need_reading() -> (
        None):
    sizes = {}
    for count in (8, 64):
        ranks = records(count, metrics=12, points=200)
        for record in ranks:
            record.gpu = None
        sizes[count] = len(json.dumps(ViewWriter(3, "gpu-node-003").write(RUNNING, ranks, 0)))
    assert abs(sizes[8] - sizes[64]) <= 8 and sizes[64] < 1200, sizes
    ranks = records(8)
    ranks[5].mark_exit(2)  # failed on its own
    ranks[6].stalled = True  # named by the stall rule
    ranks[7].signals_sent.append(ev.SignalSent(15, 1.0, "stop", ev.Purpose.STOP))
    ranks[7].mark_exit(-15)  # a stop's collateral: every rank would be, after a stop
    ((_, wire),) = ViewWriter(3, "h").write(RUNNING, ranks, 0)
    row = ViewReader.decode(wire)
    assert row is not None and [s.rank for s in row.ranks] == [5, 6]
    assert row.summary is not None and row.summary.exit_code == 2


def test_a_view_carries_its_curves_for_a_newly_opened_node_and_every_30th_view_only() -> None:
    from forgelm_tui.cluster.views import CURVE_EVERY

    writer, ranks = ViewWriter(1, "h1"), records(2, metrics=1, points=200)

    def curves(watchers: int) -> tuple[bool, int]:
        ranks[0].step += 1  # a view only when something changed
        view = ViewReader.decode(dict(writer.write(RUNNING, ranks, watchers)).get("view"))
        assert view is not None
        return (all(s.metrics_history for s in view.ranks), len(json.dumps(to_wire(view))))

    with_curves, full = curves(1)  # a view opened it
    assert with_curves
    without = [curves(1) for _ in range(CURVE_EVERY)]
    assert not any(c for c, _ in without)
    assert max(n for _, n in without) * 4 < full
    assert curves(1)[0]  # the 31st since the last with curves
    assert not curves(1)[0]
    assert curves(2)[0]  # another view opened it
    assert not curves(1)[0]  # one closed it: nobody new
    assert not writer.due(500.0, viewers=0)  # then nobody views for a while...
    assert curves(1)[0]  # ...and whoever comes next gets the curves


def test_a_viewer_grows_a_remote_ranks_curve_from_views_without_one() -> None:
    from forgelm_tui.tui.model import RunModel

    clock = FakeClock(1000.0)
    model = RunModel("r", ["x"], 4, clock)
    model.apply(ev.RunStarted("r", 4, ("x",), "/runs/x", 1000.0, 0, 2))
    writer, ranks = ViewWriter(1, "h1"), records(2, metrics=1, points=5)
    for step in (5, 6, 7):  # the first with curves, then without
        for record in ranks:
            record.step, record.metrics = step, {"metric_0": 1.0 / (step + 1)}
        view = ViewReader.decode(dict(writer.write(RUNNING, ranks, 1))["view"])
        assert view is not None
        model.apply(view)
        clock.advance(1.0)
    curve = model.ranks[1].history.metrics.curve("metric_0")
    assert [step for step, _ in curve] == [0, 1, 2, 3, 4, 6, 7]  # 5 points sent, 2 grown


# ---------------------------------------------------------------------- the summary


def test_another_node_is_open_unless_the_only_open_one_is_this_one() -> None:
    view = ClusterView(me=2, timeout=10.0, seen_mono=0.0)
    for summary, live in [({"seq": 1, "open": 3}, True), ({"seq": 2, "open": 1, "open_one": 2},
                          False), ({"seq": 3, "open": 1, "open_one": 0}, True),
                          ({"seq": 4, "open": 0}, False)]:
        view.read({"phase": "running", **summary}, now=1.0)
        assert view.live() is live, summary


def test_the_youngest_progress_is_another_nodes_aged_since_the_summary_was_read() -> None:
    clock = FakeClock()
    liveness = Liveness([1, 2, 3], 10.0, clock())
    for node, age in [(1, 4.0), (2, 1.0), (3, 9.0)]:
        liveness.beat(node, beat(node, age=age), clock())
    clock.advance(2.0)  # node 0 summarises 2 s after it read the beats
    summary = summarise(1, NodeBeat(0, RUNNING, 1, 6.0, {}), liveness, clock(), 0, False, False)
    assert summary["ages"] == [[3.0, 2], [6.0, 0]]  # the two youngest, aged 2 s
    on_2, on_1 = ClusterView(2, 10.0, clock()), ClusterView(1, 10.0, clock())
    on_2.read(summary, clock())
    on_1.read(summary, clock())
    clock.advance(1.5)
    assert on_2.progress_age(clock()) == 7.5  # not its own 3.0: node 0's 6.0, read 1.5 s ago
    assert on_1.progress_age(clock()) == 4.5


def test_the_summary_merges_every_nodes_collective_bounds() -> None:
    liveness = Liveness([1, 2], 10.0, 0.0)
    liveness.beat(1, NodeBeat(1, RUNNING, 1, 1.0, {"0": (5, 5)}).wire(1, "h", 0), now=0.5)
    liveness.beat(2, NodeBeat(2, RUNNING, 1, 1.0, {"0": (6, 6), "1": (2, 3)}).wire(1, "h", 0),
                  now=0.5)
    summary = summarise(1, NodeBeat(0, RUNNING, 1, 1.0, {"0": (6, 6)}), liveness, 1.0, 0,
                        False, False)
    view = ClusterView(1, 10.0, 0.0)
    view.read(summary, 1.0)
    assert view.collective_bounds() == {"0": (5, 6), "1": (2, 3)}


def test_node_0_is_lost_when_its_summary_stands_still_for_the_node_timeout() -> None:
    view = ClusterView(me=1, timeout=10.0, seen_mono=0.0)
    view.read({"seq": 1, "phase": "running", "open": 2}, now=1.0)
    view.read({"seq": 1, "phase": "running", "open": 2}, now=10.5)  # the same one again
    assert not view.check(10.99) and view.live()
    assert view.check(11.0) and not view.check(12.0)  # once
    assert view.state is NodeState.LOST and not view.live() and view.progress_age(12.0) is None
    assert view.silent_before(failure_at=11.5, slack=1.0) == 0
    assert view.read({"seq": 2, "phase": "running", "open": 2}, now=13.0) is False  # stays lost


def test_node_0_done_is_still_read() -> None:
    """Node 0's ranks may end first: its summary goes on until the verdict."""
    view = ClusterView(me=1, timeout=10.0, seen_mono=0.0)
    assert view.read({"seq": 1, "phase": "done", "open": 2}, now=1.0) is True
    assert view.read({"seq": 2, "phase": "done", "open": 1, "open_one": 1,
                      "ages": [[0.5, 3]]}, now=2.0) is False
    assert not view.live() and view.progress_age(2.0) == 0.5


# ---------------------------------------------------------------------- a stall, told first


def _link(tmp_path: Any, me: int) -> Any:
    """A node's link, not started (no threads): what its loop side does with events."""
    import sys

    from forgelm_tui.cluster.config import ClusterConfig
    from forgelm_tui.cluster.join import Membership, NodeInfo
    from forgelm_tui.cluster.link import NodeLink
    from forgelm_tui.cluster.summary import LinkPeers
    from forgelm_tui.engine.spec import LaunchSpec
    from forgelm_tui.engine.supervisor import Supervisor

    class Store(FakeStore):
        def set_timeout(self, seconds: float) -> None:
            self.timeout = seconds

    spec = LaunchSpec(argv=(sys.executable, "t.py"), run_id="r", run_dir=tmp_path,
                      nproc_per_node=1, master_addr="127.0.0.1", master_port=29999, grace=5.0,
                      cwd=tmp_path, nnodes=2, node_rank=me)
    nodes = tuple(NodeInfo(n, f"h{n}", 100 + n, 1, "v") for n in range(2))
    config = ClusterConfig(2, me, "127.0.0.1", 29998, "127.0.0.1", 29999, "r", True, 1)
    return NodeLink(Supervisor(spec, base_env={}), Membership("r", me, 2, "127.0.0.1", 29999,
                                                               nodes, me == 0),
                    config, Store(), LinkPeers())


async def test_a_stall_declared_here_is_told_to_every_node_before_its_stacks_are_captured(
        tmp_path: Any) -> None:
    """A node that declares a stall publishes it at once (RunStalled), not after its stacks
    and its own ranks' signals: the other nodes capture their stacks while every rank still
    waits where it hung. Its own record read back changes nothing; another node's applies."""
    link = _link(tmp_path, 1)
    link.on_event(ev.RunStalled(4.0, (1,)))
    kind, payload = link._urgent.get_nowait()
    assert kind == "stop" and link.sup.stop is None  # told before this node stops anything
    assert (payload["kind"], payload["reason"], payload["origin_node"], payload["grace"]) == (
        "stall", "stalled: no rank made progress for 4 s", 1, 5.0)
    link._remote_stop(payload)  # its own broadcast, read back
    assert link.agreed_stop == payload and link.sup.stop is None
    other = _link(tmp_path / "n0", 0)
    other._remote_stop(payload)  # node 0 gets it: its stacks (no live rank here), then the stop
    assert other.sup.stop is not None and other.sup.stop.kind.value == "stall"
    assert other.sup.stop.reason == "stalled: no rank made progress for 4 s (on node 1)"


def test_the_inbox_and_ticker_take_the_joins_spares_before_making_a_connection() -> None:
    from forgelm_tui.cluster.store import Connections

    spares = [FakeStore(), FakeStore()]
    for spare in spares:
        spare.set_timeout = lambda seconds, s=spare: setattr(s, "timeout", seconds)  # type: ignore[method-assign]
    made: list[tuple[str, int, float]] = []
    main = FakeStore()
    main.client = lambda host, port, timeout: made.append((host, port, timeout)) or spares[0]  # type: ignore[method-assign]
    connections = Connections(main, spares, "node0", 29400, 30.0)
    assert connections.spare(1.0) is spares[1] and spares[1].timeout == 1.0
    assert connections.spare(2.0) is spares[0] and spares[0].timeout == 2.0
    assert made == []  # no connection made while a spare was left
    connections.spare(2.0)
    assert made == [("node0", 29400, 30.0)]  # then (a call timed out) a new one, to node 0
