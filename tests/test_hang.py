"""Hangs named from collective counts (engine/hang.py, docs/progress.md "Hangs"): the gap rule
of the stall clock in-process with an injected clock, the naming on envelope entries, and real
gloo ranks whose last rank stops taking part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import rank_record, rank_script, start
from policy_harness import harness

from forgelm_tui.engine import hang
from forgelm_tui.engine.records import Evidence
from forgelm_tui.engine.states import ProgressEvidence
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(10)

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _entry(rank: int, counts: dict[str, int] | None, stuck_at: str | None = None,
           stalled: bool = True) -> dict[str, Any]:
    return {"rank": rank, "collectives": counts, "stuck_at": stuck_at, "stalled": stalled,
            "stacks_file": f"/run/rank-{rank}.stacks.txt"}


def test_the_ranks_below_the_highest_count_never_entered_the_collective() -> None:
    ranks = [_entry(0, {"0": 41}, f"{C10D}:2950 all_reduce"),
             _entry(1, {"0": 41}, f"{C10D}:2950 all_reduce"),
             _entry(2, {"0": 40}, "/job/train.py:12 <module>"),
             _entry(3, {"0": 41}, f"{C10D}:2950 all_reduce")]
    found = hang.name(ranks)
    assert found == {
        "collective": {"pg": "0", "seq": 41, "op": "all_reduce", "op_from": "stacks"},
        "waiting_ranks": [0, 1, 3], "missing_ranks": [2], "mismatch": None, "other_groups": [],
        "trace_files": ["/run/rank-2.stacks.txt", "/run/rank-0.stacks.txt",
                        "/run/rank-1.stacks.txt", "/run/rank-3.stacks.txt"]}
    assert hang.sentence(found) == ("rank 2 never entered all_reduce #41 of process group 0; "
                                    "ranks 0-1, 3 wait in it")


def test_ranks_at_one_count_in_different_collectives_are_a_mismatch() -> None:
    """A stop handler's broadcast on rank 0 against the loop's all_reduce on rank 1: both
    entered collective #5, different ones (tests/test_stop_together.py's handler-collective)."""
    ranks = [_entry(0, {"0": 5}, f"{C10D}:3151 broadcast"),
             _entry(1, {"0": 5}, f"{C10D}:3252 all_reduce")]
    found = hang.name(ranks)
    assert found is not None and found["mismatch"] == {"broadcast": [0], "all_reduce": [1]}
    assert (found["waiting_ranks"], found["missing_ranks"]) == ([0, 1], [])
    assert found["collective"] == {"pg": "0", "seq": 5, "op": None, "op_from": "stacks"}
    assert hang.sentence(found) == ("ranks 0-1 wait at collective #5 of process group 0 in "
                                    "different collectives: broadcast (rank 0), all_reduce "
                                    "(rank 1)")
    same = [_entry(0, {"0": 5}, f"{C10D}:3252 all_reduce"), _entry(1, {"0": 5}, None)]
    assert hang.name(same) is None  # one collective seen: nothing to say


def test_no_gap_no_hang_and_unknown_counts_are_left_out() -> None:
    assert hang.name([_entry(0, {"0": 9}), _entry(1, {"0": 9})]) is None  # stuck elsewhere
    assert hang.name([_entry(0, None), _entry(1, None)]) is None  # no trace
    # a rank that said no count (no trace in it) is neither waiting nor missing
    found = hang.name([_entry(0, {"0": 5}), _entry(1, {"0": 4}), _entry(2, None)])
    assert found is not None and (found["waiting_ranks"], found["missing_ranks"]) == ([0], [1])
    # a rank that had ended before the stall (not stalled) is not part of it
    assert hang.name([_entry(0, {"0": 5}), _entry(1, {"0": 4}, stalled=False)]) is None
    assert found["collective"]["op"] is None and hang.sentence(found) == (
        "rank 1 never entered collective #5 of process group 0; rank 0 waits in it")


def test_of_several_groups_the_one_whose_missing_ranks_wait_nowhere_is_named() -> None:
    """Rank 3 is stuck outside any collective: its tensor-parallel peer 2 waits for it in group
    2 and so never enters the default group's all_reduce that 0 and 1 wait in. The cause is
    rank 3, in group 2."""
    ranks = [_entry(0, {"0": 7, "1": 3}), _entry(1, {"0": 7, "1": 3}),
             _entry(2, {"0": 6, "2": 3}), _entry(3, {"0": 6, "2": 2})]
    found = hang.name(ranks)
    assert found is not None
    assert (found["collective"]["pg"], found["collective"]["seq"]) == ("2", 3)
    assert (found["waiting_ranks"], found["missing_ranks"]) == ([2], [3])
    assert found["other_groups"] == ["0"]


@pytest.mark.parametrize(("stuck_at", "op"), [
    (f"{C10D}:4800 barrier", "barrier"),
    (f"{C10D}:3400 all_gather_into_tensor", "all_gather_into_tensor"),
    (f"{C10D}:90 wrapper", None),
    ("/venv/lib/python3.11/site-packages/torch/autograd/graph.py:829 _engine_run_backward",
     "all_reduce"),  # DDP's gradient all-reduce, waited for at the end of backward
    ("/job/train.py:3 <module>", None),
    (None, None),
])
def test_the_op_is_read_from_a_waiting_ranks_innermost_frame(stuck_at: str | None,
                                                            op: str | None) -> None:
    assert hang.op_of(stuck_at) == op


def test_rank_lists_are_ranges() -> None:
    assert hang.rank_list([3]) == "rank 3"
    assert hang.rank_list([5, 0, 1, 2, 7, 8]) == "ranks 0-2, 5, 7-8"


def test_bounds_travel_as_small_lists_and_bad_ones_are_dropped() -> None:
    a = rank_record(0, pid=1, started_mono=0.0)
    b = rank_record(1, pid=2, started_mono=0.0)
    a.collectives, b.collectives = {"0": 4, "1": 2}, {"0": 5}
    found = hang.bounds([a, b])
    assert found == {"0": (4, 5), "1": (2, 2)}
    assert hang.from_wire(hang.to_wire(found)) == found
    assert hang.from_wire({"0": [1, 2], "1": [1], "2": "x", "3": [1.5, 2]}) == {"0": (1, 2)}
    assert hang.from_wire(None) == {}
    assert hang.merge([found, {"0": (1, 3), "7": (0, 0)}]) == {
        "0": (1, 5), "1": (2, 2), "7": (0, 0)}


def _counts(h: Any, **ranks: dict[str, int]) -> None:
    for rank, counts in ranks.items():
        h.records[int(rank[1:])].collectives = counts


def test_a_laggard_that_prints_does_not_keep_its_waiting_peers_alive() -> None:
    """The chatty laggard: rank 1 prints (from a background thread) and uses CPU, but never
    enters the all_reduce rank 0 waits in: stalled one stall timeout after the gap began, not
    after its last line; the stacks of the missing rank are asked for first."""
    h = harness(2, stall_timeout=5.0, grace=2.0)
    for record in h.records.values():
        record.progress_evidence = ProgressEvidence.OUTPUT
    h.effects.hold_stacks = True
    start = h.clock.now
    _counts(h, r0={"0": 10}, r1={"0": 10})
    h.advance(3.0)
    h.policy.progress_checked(h.clock.now)
    _counts(h, r0={"0": 11})  # rank 0 entered #11; rank 1 never will
    for _ in range(7):
        h.advance(1.0)
        h.records[1].saw(Evidence.OUTPUT, h.clock.now)  # its thread prints every second
        h.policy.progress_checked(h.clock.now)
        if h.policy._after_stacks is not None:
            break
    assert h.clock.now - start == pytest.approx(9.0)  # the gap was seen at 4 s; 5 s later
    assert h.records[1].behind and not h.records[0].behind
    assert [ranks for ranks, *_ in h.effects.captures] == [(1, 0)]  # the missing rank first
    assert all(r.stalled for r in h.records.values())


def test_a_heartbeat_from_the_laggards_main_thread_is_a_long_phase_not_a_hang() -> None:
    """ForgeLM's shape: rank 0 evaluates for minutes with no collective while rank 1 waits in
    a barrier; its main thread's heartbeats (or its steps) keep the run alive."""
    h = harness(2, stall_timeout=5.0)
    _counts(h, r0={"0": 3}, r1={"0": 4})
    for _ in range(60):
        h.advance(1.0)
        h.records[0].saw(Evidence.HEARTBEAT, h.clock.now)
        h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is None


def test_without_a_gap_output_still_counts() -> None:
    """Every rank at the same count (a long phase outside collectives on every rank, or no
    trace): the evidence levels of docs/progress.md, unchanged."""
    h = harness(2, stall_timeout=5.0)
    h.records[0].progress_evidence = ProgressEvidence.OUTPUT
    _counts(h, r0={"0": 3}, r1={"0": 3})
    for _ in range(30):
        h.advance(1.0)
        h.records[0].saw(Evidence.OUTPUT, h.clock.now)
        h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is None and h.records[0].gap_since is None


def test_ranks_that_destroyed_their_groups_are_no_gap_their_output_counts_again() -> None:
    """After destroy_process_group the ranks' last counts freeze where each was last read
    (rank 0 at 22, rank 1 at 21): a gap that is no hang. Each says its groups are gone
    (rank/collectives.py): their last lines count again, no stall while they print; their
    counts stay for the envelope."""
    from forgelm_tui.channel import Message, MessageKind
    from forgelm_tui.engine.progress import ProgressReader

    h = harness(2, stall_timeout=5.0)
    for record in h.records.values():
        record.progress_evidence = ProgressEvidence.OUTPUT
    _counts(h, r0={"0": 22}, r1={"0": 21})
    h.policy.progress_checked(h.clock.now)
    assert h.records[1].gap_since is not None  # what froze looks like a gap...
    reader = ProgressReader(lambda event: None)
    for rank in (0, 1):
        reader.read_message(h.records[rank], Message(rank, MessageKind.COLLECTIVES, 0.0,
                                                      groups={}))
    for _ in range(30):
        h.advance(1.0)
        h.records[0].saw(Evidence.OUTPUT, h.clock.now)  # tearing down, printing
        h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is None and h.records[1].gap_since is None  # ...and is none
    assert h.records[0].collectives == {"0": 22} and h.records[0].collectives_over


def test_a_rank_reports_its_groups_gone_once_after_it_destroyed_them() -> None:
    from forgelm_tui.rank.collectives import to_say

    said, last = [], None
    for counts in (None, {"0": 1}, {"0": 1}, {"0": 2}, None, None):
        what, last = to_say(counts, last)
        said.append(what)
    assert said == [None, {"0": 1}, None, {"0": 2}, {}, None]


def test_a_rank_says_its_groups_are_over_when_its_program_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At exit (atexit, before torch's own handlers), whatever the watcher thread said last:
    a CI run stalled two ranks in their interpreter teardown (garbage collecting, seconds on a
    loaded machine) on counts frozen at 62 and 64, the watcher already gone."""
    import atexit

    from forgelm_tui.rank import collectives

    registered: list[Any] = []
    monkeypatch.setattr(atexit, "register", lambda f, *args: registered.append((f, args)))
    monkeypatch.setattr(collectives, "_watch", lambda report: None)  # no thread needed here
    sent: list[tuple[Any, dict[str, Any]]] = []
    collectives._start(lambda kind, **fields: sent.append((kind, fields)))
    ((callback, args),) = registered
    callback(*args)
    assert [fields for _, fields in sent] == [{"groups": {}}]


def test_a_gap_that_closes_gives_the_output_back() -> None:
    h = harness(2, stall_timeout=5.0)
    h.records[1].progress_evidence = ProgressEvidence.OUTPUT
    _counts(h, r0={"0": 4}, r1={"0": 3})
    for second in range(12):
        h.advance(1.0)
        if second == 3:
            _counts(h, r1={"0": 4})  # it entered: the collective completed
            h.records[1].saw(Evidence.COLLECTIVE, h.clock.now)
        h.records[1].saw(Evidence.OUTPUT, h.clock.now)
        h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is None and h.records[1].gap_since is None


def test_a_rank_silent_before_the_gap_is_aged_from_its_silence() -> None:
    """Entering a gap never makes a rank younger: one silent for 4 s when its peer enters a
    collective has 1 s left of a 5 s timeout."""
    h = harness(2, stall_timeout=5.0)
    _counts(h, r0={"0": 2}, r1={"0": 2})
    h.advance(4.0)
    h.policy.progress_checked(h.clock.now)
    _counts(h, r0={"0": 3})
    h.advance(1.0)
    h.policy.progress_checked(h.clock.now)
    assert h.policy._after_stacks is not None or h.policy.stop is not None


def test_a_peer_nodes_bounds_make_the_gap() -> None:
    """Multi-node: this node's ranks all stand at 9; another node's heartbeat says one of its
    ranks is at 10. The gap is seen here, and this node's ranks are the missing ones."""

    class Peers:
        def live(self) -> bool:
            return True

        def progress_age(self, now: float) -> float | None:
            return 100.0

        def collective_bounds(self) -> hang.Bounds:
            return {"0": (10, 10)}

    h = harness(2, stall_timeout=5.0)
    h.policy.peers = Peers()
    _counts(h, r0={"0": 9}, r1={"0": 9})
    h.advance(1.0)
    h.policy.progress_checked(h.clock.now)
    assert all(r.behind and r.gap_since == h.clock.now for r in h.records.values())


def test_counts_after_the_stall_stay_as_they_were() -> None:
    from forgelm_tui.channel import Message, MessageKind
    from forgelm_tui.engine.progress import ProgressReader

    record = rank_record(0, pid=1, started_mono=0.0)
    record.collectives, record.stalled = {"0": 4}, True
    ProgressReader(lambda e: None).read_message(
        record, Message(0, MessageKind.COLLECTIVES, 1.0, groups={"0": 5}))
    assert record.collectives == {"0": 4}


@pytest.mark.timeout(150)
def test_chatty_laggards_are_named_and_a_long_phase_with_heartbeats_is_not(
        tmp_path: Path) -> None:
    """Real gloo ranks, --stall-timeout 4, three runs at once:
    - ``chatty``: after 10 steps rank 1 never enters the next all_reduce; it loops on sleep
      while a thread prints; rank 0 waits in it: stalled, exit 2, the hang named;
    - the same on two nodes on loopback, one rank each: node 0 sees the gap from node 1's
      heartbeat (its lowest count), node 1 from node 0's (its highest): both end 2 with the
      same hang, each node's stacks file named;
    - ``pause``: rank 1 evaluates for 6 s (no collective, printing, a heartbeat from its main
      thread every 0.5 s) while rank 0 waits in a barrier: ends 0, nobody stalled.
    The chatty ranks play NCCL's flight-recorder pipe (tests/ranks/nccl_recorder_double.py):
    the stall asks each for its dump, which lands in its own node's run dir and is named
    after the stacks; the pause's ranks have no pipe and no dump.
    (The silent laggard: test_stall.py's collective deadlock.)"""
    from cluster_nodes import no_orphans, same_envelopes, start_nodes, wait_all

    runs = {}
    for mode in ("chatty", "pause"):
        (tmp_path / mode).mkdir()
        runs[mode] = start(["--nproc-per-node", "2", "--standalone", "--stall-timeout", "4",
                            rank_script("laggard_gloo.py"), mode], tmp_path / mode,
                           env={"PLAY_NCCL_RECORDER": "1"} if mode == "chatty" else None)
    (tmp_path / "nodes").mkdir()
    nodes = start_nodes(2, [rank_script("laggard_gloo.py"), "chatty"], tmp_path / "nodes",
                        common=["--stall-timeout", "4", "--grace", "2"],
                        env={"PLAY_NCCL_RECORDER": "1"})
    chatty, pause = runs["chatty"], runs["pause"]
    chatty.wait(120)
    pause.wait(120)
    out = "".join(chatty.output())
    envelope = chatty.envelope()
    assert chatty.proc.returncode == 2, out
    assert envelope["stop"]["kind"] == StopKind.STALL.value
    found = envelope["hang"]
    assert found["missing_ranks"] == [1] and found["waiting_ranks"] == [0], found
    assert found["collective"]["op"] == "all_reduce" and found["collective"]["pg"] == "0", [
        (r["rank"], r["stuck_at"], r["stacks_note"]) for r in envelope["ranks"]]
    run = tmp_path / "chatty" / "run"
    assert found["trace_files"] == [str(run / "rank-1.stacks.txt"), str(run / "rank-0.stacks.txt"),
                                    str(run / "nccl-trace-rank-1"), str(run / "nccl-trace-rank-0")]
    assert [r["nccl_dump_file"] for r in envelope["ranks"]] == found["trace_files"][:1:-1]
    # the handler went in from the collectives watcher's thread (its first channel message)
    assert [r["stacks_via"] for r in envelope["ranks"]] == ["faulthandler"] * 2, [
        r["stacks_note"] for r in envelope["ranks"]]
    assert "hang: rank 1 never entered all_reduce #" in out
    assert "rank 1 is quiet (its peers wait in a collective it has not entered" in out

    out = "".join(pause.output())
    envelope = pause.envelope()
    assert pause.proc.returncode == 0, out
    assert envelope["stop"] is None and envelope["hang"] is None
    assert [r["nccl_dump_file"] for r in envelope["ranks"]] == [None, None]
    assert not any(r["stalled"] for r in envelope["ranks"])
    assert "rank 0: done" in out and "rank 1: done" in out  # every step, after the pause

    assert wait_all(nodes, 120) == [2, 2]
    envelope = same_envelopes(nodes)
    assert envelope["stop"]["kind"] == "stall"
    found = envelope["hang"]
    assert (found["missing_ranks"], found["waiting_ranks"]) == ([1], [0]), found
    assert found["collective"]["op"] == "all_reduce", [
        (r["rank"], r["stuck_at"], r["stacks_note"]) for r in envelope["ranks"]]
    assert found["trace_files"] == [
        str(tmp_path / "nodes" / "run" / f"node-{n}" / name.format(n))
        for name in ("rank-{}.stacks.txt", "nccl-trace-rank-{}") for n in (1, 0)], found
    for node in nodes:
        assert "hang: rank 1 never entered all_reduce #" in "".join(node.output())
    no_orphans([p for n in nodes for p in n.rank_pids()])
