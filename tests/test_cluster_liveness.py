"""Pure multi-node logic (SPEC §8): heartbeats on an injected clock, one global verdict."""

from __future__ import annotations

import dataclasses
import json
import signal
from typing import Any

import pytest
from conftest import rk

from forgelm_tui.cluster import agreement
from forgelm_tui.cluster.liveness import Liveness
from forgelm_tui.cluster.wire import ending_from_wire, ending_to_wire, stop_from_wire, stop_to_wire
from forgelm_tui.engine.codec import decode, encode
from forgelm_tui.engine.events import NodeState
from forgelm_tui.engine.records import StopRecord
from forgelm_tui.envelope.build import build
from forgelm_tui.plan.planner import RunInfo
from forgelm_tui.session.outcome import Agreement, NodeOutcome, RunFrame, RunOutcome
from forgelm_tui.verdict import Contract, RankEnding, StopFacts, StopKind, Verdict, decide

pytestmark = pytest.mark.timeout(30)

F, R = Contract.FORGELM, Contract.RAW


def beat(seq: int, phase: str = "running", **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "phase": phase, **fields}


# ---------------------------------------------------------------------- liveness


def test_advancing_beats_keep_a_node() -> None:
    live = Liveness([1], timeout=10.0, now=0.0)
    for t in range(0, 200, 5):
        live.beat(1, beat(t), now=float(t))
        assert live.check(float(t) + 9.9) == []
    assert live.peers[1].state is NodeState.RUNNING


def test_silent_node_lost_exactly_once() -> None:
    live = Liveness([1, 2], timeout=10.0, now=0.0)
    live.beat(1, beat(1), now=1.0)
    live.beat(2, beat(1), now=1.0)
    for t in (5.0, 9.0, 10.5):  # node 1 repeats its seq: not a heartbeat
        live.beat(1, beat(1), now=t)
        live.beat(2, beat(int(t) + 1), now=t)
    assert live.check(10.99) == []
    assert live.check(11.0) == [1]
    assert live.check(11.5) == [] and live.check(100.0) == [2]
    assert live.peers[1].state is NodeState.LOST and live.peers[1].live_ranks == 0
    assert live.beat(1, beat(50), now=101.0) is False  # lost stays lost
    assert live.peers[1].state is NodeState.LOST and live.check(200.0) == []


def test_a_node_that_never_beats_is_lost_from_the_start() -> None:
    live = Liveness([3], timeout=2.0, now=100.0)
    assert live.check(101.9) == []
    assert live.check(102.0) == [3]


def test_done_nodes_are_never_lost() -> None:
    live = Liveness([1, 2], timeout=1.0, now=0.0)
    live.beat(1, beat(1, live=2), now=0.5)
    live.done(1)
    live.beat(2, beat(7, "done"), now=0.5)
    live.done(2)
    assert live.peers[1].live_ranks == 0
    assert live.check(1e6) == [] and live.lose_all() == []
    assert live.beat(1, beat(2), now=2.0) is False
    assert live.peers[1].state is NodeState.DONE and live.peers[2].state is NodeState.DONE


def test_done_does_not_revive_a_lost_node() -> None:
    live = Liveness([1], timeout=1.0, now=0.0)
    assert live.check(1.0) == [1]
    live.done(1)
    assert live.peers[1].state is NodeState.LOST


def test_lose_all_once() -> None:
    live = Liveness([1, 2, 3], timeout=5.0, now=0.0)
    live.beat(1, beat(1, live=1), now=0.0)
    live.beat(2, beat(1), now=4.0)
    live.done(3)
    assert live.check(5.0) == [1]
    assert live.lose_all() == [2]
    assert live.lose_all() == []
    states = {n: p.state for n, p in live.peers.items()}
    assert states == {1: NodeState.LOST, 2: NodeState.LOST, 3: NodeState.DONE}


def test_live_while_a_node_joins_or_runs() -> None:
    live = Liveness([1, 2], timeout=5.0, now=0.0)
    assert live.live()  # both still joining
    live.beat(1, beat(0, "joining"), now=0.1)
    live.beat(2, beat(1, "running"), now=0.1)
    live.done(1)
    assert live.live()
    live.done(2)
    assert not live.live()
    assert not Liveness([], timeout=5.0, now=0.0).live()


def test_progress_age_is_aged_from_when_the_beat_was_read() -> None:
    live = Liveness([1, 2, 3], timeout=60.0, now=0.0)
    assert live.progress_age(1.0) is None
    live.beat(1, beat(1, live=2, progress_age=3.0), now=10.0)
    live.beat(2, beat(1, live=1, progress_age=1.0), now=12.0)
    live.beat(3, beat(1, live=0, progress_age=0.0), now=12.0)  # no live rank: not counted
    assert live.progress_age(15.0) == pytest.approx(4.0)  # min(3 + 5, 1 + 3)
    live.beat(2, beat(1, live=1, progress_age=1.0), now=20.0)  # same seq: not re-read
    assert live.progress_age(20.0) == pytest.approx(9.0)  # min(3 + 10, 1 + 8)
    live.beat(2, beat(2, live=1, progress_age=0.5), now=20.0)
    assert live.progress_age(21.0) == pytest.approx(1.5)
    live.done(2)
    assert live.progress_age(21.0) == pytest.approx(14.0)
    live.beat(1, beat(2, live=2, progress_age=None), now=21.0)
    assert live.progress_age(22.0) is None


def test_progress_age_ignores_joining_and_lost_nodes() -> None:
    live = Liveness([1, 2], timeout=5.0, now=0.0)
    live.beat(1, beat(1, "joining", live=1, progress_age=0.0), now=1.0)
    live.beat(2, beat(1, live=1, progress_age=0.0), now=1.0)
    assert live.progress_age(2.0) == pytest.approx(1.0)
    assert live.check(6.0) == [1, 2]
    assert live.progress_age(6.0) is None


def test_beat_reports_a_change_only_for_state() -> None:
    """A heartbeat carries no rank details (cluster/views.py): only the node's state is news."""
    live = Liveness([1], timeout=60.0, now=0.0)
    assert live.beat(1, beat(0, "joining"), now=1.0) is False  # still joining
    assert live.beat(1, beat(1), now=2.0) is True
    assert live.beat(1, beat(1), now=3.0) is False
    assert live.beat(1, beat(2, host="h2", progress_age=7.0, live=1), now=4.0) is False
    assert live.peers[1].host == "h2" and live.peers[1].progress_age == 7.0
    # done only once its final is read: the verdict needs every node's records
    assert live.beat(1, beat(3, "done"), now=6.0) is False
    assert live.peers[1].state is NodeState.RUNNING and live.live()
    live.done(1)
    assert live.beat(1, beat(4, "running"), now=7.0) is False  # done stays done
    assert live.peers[1].state is NodeState.DONE and not live.live()


# ---------------------------------------------------------------------- the global verdict


def stop(kind: StopKind, origin_rank: int | None = None, origin_node: int = 0,
         lost_node: int | None = None, sig: int | None = None) -> StopRecord:
    return StopRecord(kind, f"{kind.value} stop", kind.value, sig, 1_700_000_000.0, 123.0,
                      grace=5.0, origin_rank=origin_rank, origin_node=origin_node,
                      lost_node=lost_node)


def final(node: int, endings: list[RankEnding], launch_error: str | None = None,
          **part: Any) -> dict[str, Any]:
    """A node's final records as it publishes them, through JSON as the store carries them."""
    ranks = tuple({"rank": e.rank, "node_rank": node, "exit_code": e.exit_code,
                   "state": "killed" if e.signalled_first else "failed" if e.exit_code
                   else "exited"} for e in reversed(endings))
    outcome = NodeOutcome(node, f"host{node}", 100 + node, f"/runs/x/node-{node}", ranks,
                          launch_error=launch_error, **part)
    data = {"outcome": encode(outcome), "endings": [ending_to_wire(e) for e in endings],
            "launch_error": launch_error}
    return dict(json.loads(json.dumps(data)))


def wire(record: StopRecord) -> dict[str, Any]:
    return dict(json.loads(json.dumps(stop_to_wire(record))))


def two_failing_nodes() -> dict[int, dict[str, Any]]:
    """Rank 1 (node 0) ended at 5.0 on node 0's clock, rank 3 (node 1) at 9000.0 on node
    1's: the clocks say rank 1 was first; only the stop record can say who was."""
    return {0: final(0, [rk(0, 143, t=6.0, signalled=True), rk(1, 7, t=5.0)]),
            1: final(1, [rk(2, 0, t=9001.0, signalled=True), rk(3, 9, t=9000.0)])}


@pytest.mark.parametrize(("contract", "code"), [(R, 9), (F, 2)])
def test_root_cause_is_the_stop_origin_not_the_earliest_clock(contract: Contract,
                                                              code: int) -> None:
    finals = two_failing_nodes()
    record = wire(stop(StopKind.FAILURE, origin_rank=3, origin_node=1))
    verdict = agreement.decide_global(finals, record, contract)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (code, 2, 3)
    assert "rank 3" in verdict.rule_text
    assert agreement.decide_global(finals, None, R).deciding_rank == 1  # the clocks' answer


def test_after_a_cancel_the_first_failure_in_the_store_is_the_root_cause() -> None:
    """A cancel was written first; ranks on two nodes then failed on their own before the stop
    reached them: the first failure any node wrote to the store decides, not the clocks."""
    finals = two_failing_nodes()
    cancel = wire(stop(StopKind.CANCEL, origin_node=0, sig=signal.SIGTERM))
    first = {"rank": 3, "node": 1}
    verdict = agreement.decide_global(finals, cancel, R, first)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (9, 2, 3)
    assert agreement.decide_global(finals, None, R, first).deciding_rank == 3
    failure = wire(stop(StopKind.FAILURE, origin_rank=1, origin_node=0))
    assert agreement.decide_global(finals, failure, R, first).deciding_rank == 1  # the stop's


@pytest.mark.parametrize("contract", [F, R])
def test_node_lost_without_failures_is_a_training_error(contract: Contract) -> None:
    finals = {0: final(0, [rk(0, 0, signalled=True), rk(1, None, signal.SIGTERM,
                                                         signalled=True)])}
    record = wire(stop(StopKind.NODE_LOST, lost_node=1, sig=None))
    verdict = agreement.decide_global(finals, record, contract)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (2, 2, None)
    assert "node 1" in verdict.rule_text
    outcome = RunOutcome(verdict, RunFrame(), (decode(NodeOutcome, finals[0]["outcome"]),),
                         agreement=Agreement(True, 0, (1,), 2))
    assert build(info(0), outcome, run_dir="/r")["root_cause_node"] == 1  # the lost one
    for nothing in ({}, {0: final(0, [])}):
        assert agreement.decide_global(nothing, record, contract).code == 2


def test_a_launch_error_anywhere_is_a_config_error() -> None:
    finals = {0: final(0, [rk(0, 0), rk(1, 0)]),
              1: final(1, [], launch_error="no such program: train.py")}
    verdict = agreement.decide_global(finals, None, F)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (1, 1, None)


def test_rank0_decides_over_every_node() -> None:
    finals = {1: final(1, [rk(2, 4), rk(3, 0)]), 0: final(0, [rk(0, 4), rk(1, 4)])}
    verdict = agreement.decide_global(finals, None, F)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (4, 3, 0)
    assert verdict.disagreements == ((3, 0),)
    back = decode(Verdict, json.loads(json.dumps(encode(verdict))))
    assert back == verdict


def test_wire_round_trips() -> None:
    ending = rk(5, None, signal.SIGKILL, t=float("inf"))
    assert ending_from_wire(json.loads(json.dumps(ending_to_wire(ending)))) == ending
    record = stop(StopKind.NODE_LOST, origin_node=2, lost_node=1)
    back = stop_from_wire(wire(record))
    assert back.deadline_mono == 0.0  # set when applied, never another machine's clock
    assert (back.kind, back.origin_node, back.lost_node, back.grace) == \
        (StopKind.NODE_LOST, 2, 1, 5.0)
    assert agreement.stop_facts(wire(record)) == StopFacts(StopKind.NODE_LOST, None, None, 1)
    assert agreement.stop_facts(None) is None


def info(node: int) -> RunInfo:
    return RunInfo(run_id="r", command=["python", f"train-{node}.py"], mode="script",
                   contract=F, node_rank=node, nnodes=3)


def merged(lost: list[int]) -> tuple[RunOutcome, dict[str, Any]]:
    """Node 0's merge of every node's typed outcome, and its own copy of the envelope."""
    finals = two_failing_nodes()
    finals[1] = final(1, [rk(2, 0, t=9001.0, signalled=True), rk(3, 9, t=9000.0)],
                      cancels=({"source": "operator"},), cancelled={"by": "operator"},
                      outside_signal={"rank": 3, "signal": "SIGTERM"})
    record = wire(stop(StopKind.FAILURE, origin_rank=3, origin_node=1))
    verdict = agreement.decide_global(finals, record, F)
    own = dataclasses.replace(stop(StopKind.CANCEL), grace=7.0, killed_at=1_700_000_009.0)
    outcome = RunOutcome(verdict, RunFrame(), tuple(
        decode(NodeOutcome, f["outcome"]) for _, f in sorted(finals.items())),
        stop=agreement.agreed_stop(own, record), agreement=Agreement(True, 0, tuple(lost), 3))
    back = decode(RunOutcome, json.loads(json.dumps(encode(outcome))))
    assert back == outcome  # what node 0 publishes is what every node reads
    return outcome, build(info(0), outcome, run_dir="/runs/x/node-0")


def test_merge_gathers_every_node() -> None:
    _, envelope = merged(lost=[2])
    assert [r["rank"] for r in envelope["ranks"]] == [0, 1, 2, 3]
    assert envelope["rank_states"] == {"failed": 2, "killed": 2}
    assert envelope["exit_code"] == 2 and envelope["root_cause_rank"] == 3
    assert envelope["root_cause_node"] == 1  # where to look, on every node's copy
    assert envelope["agreement"] == {"agreed": True, "decided_by_node": 0, "nodes_lost": [2]}
    nodes = envelope["nodes"]
    assert [n["node_rank"] for n in nodes] == [0, 1, 2]
    assert [n["state"] for n in nodes] == ["done", "done", "lost"]
    assert (nodes[1]["host"], nodes[1]["pid"], nodes[1]["run_dir"]) == \
        ("host1", 101, "/runs/x/node-1")
    assert sorted(nodes[1]["ranks"]) == [2, 3]
    assert nodes[2] == {"node_rank": 2, "state": "lost", "host": None, "pid": None,
                        "run_dir": None, "ranks": []}
    assert envelope["cancel_requests"] == [{"source": "operator", "node_rank": 1}]
    assert envelope["cancelled"] == {"by": "operator"}  # the stop's origin node's
    assert envelope["outside_signal"] == {"rank": 3, "signal": "SIGTERM"}
    stop_ = envelope["stop"]
    assert (stop_["kind"], stop_["origin_node"], stop_["origin_rank"]) == ("failure", 1, 3)
    assert stop_["at"].startswith("2023-11-14T") and stop_["signal"] is None
    # what only node 0's own stop knows: the grace it gave (grown here) and its SIGKILL pass
    assert stop_["grace_s"] == 7.0 and stop_["killed_at"].startswith("2023-11-14T")
    assert [r["collateral"] for r in envelope["ranks"]] == [False] * 4  # the verdict's marks


def test_merge_without_a_lost_node() -> None:
    _, envelope = merged(lost=[])
    assert envelope["agreement"]["nodes_lost"] == []
    assert envelope["nodes"][2]["state"] == "unknown"


def test_each_node_serialises_the_same_outcome_with_only_its_own_local_fields() -> None:
    outcome, mine0 = merged(lost=[2])
    mine1 = build(info(1), outcome, run_dir="/runs/x/node-1")
    local = {"node_rank", "run_dir", "command"}
    assert {k: mine1[k] for k in local} == \
        {"node_rank": 1, "run_dir": "/runs/x/node-1", "command": ["python", "train-1.py"]}
    assert {k: v for k, v in mine1.items() if k not in local} == \
        {k: v for k, v in mine0.items() if k not in local}
    assert mine0["node_rank"] == 0 and mine0["run_dir"] == "/runs/x/node-0"


# ---------------------------------------------------------------------- verdict: StopFacts


def test_origin_rank_wins_over_an_earlier_failure() -> None:
    outcomes = [rk(0, 0, t=9.0, signalled=True), rk(1, 7, t=1.0), rk(2, 9, t=2.0)]
    assert decide(outcomes, StopFacts(StopKind.FAILURE), R).deciding_rank == 1
    verdict = decide(outcomes, StopFacts(StopKind.FAILURE, origin_rank=2), R)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (9, 2, 2)


def test_an_origin_that_did_not_fail_falls_back_to_the_earliest() -> None:
    outcomes = [rk(0, 0, t=9.0, signalled=True), rk(1, 7, t=3.0), rk(2, 9, t=2.0)]
    verdict = decide(outcomes, StopFacts(StopKind.FAILURE, origin_rank=0), R)
    assert (verdict.code, verdict.deciding_rank) == (9, 2)


def test_node_lost_yields_to_a_real_failure() -> None:
    outcomes = [rk(0, 0, signalled=True), rk(1, 7, t=2.0)]
    verdict = decide(outcomes, StopFacts(StopKind.NODE_LOST, lost_node=1), R)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (7, 2, 1)


def test_node_lost_is_2_even_under_raw() -> None:
    outcomes = [rk(0, None, signal.SIGTERM, signalled=True)]
    facts = StopFacts(StopKind.NODE_LOST, signal.SIGTERM, lost_node=3)
    verdict = decide(outcomes, facts, R)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (2, 2, None)
    assert "node 3 was lost" in verdict.rule_text
    assert StopFacts(StopKind.CANCEL) == StopFacts(StopKind.CANCEL, None, None, None)


# ---------------------------------------------------------------------- a lost node as the cause


def test_a_failure_after_a_nodes_last_beat_is_collateral_of_its_loss() -> None:
    """Node 1's supervisor is SIGKILLed at t=10 (last beat read at 9.9); rank 1 on node 0 gets
    "Connection closed by peer" at 10.2; node 1 is declared lost at 11.9 (timeout 2)."""
    live = Liveness([1, 2], timeout=2.0, now=0.0)
    for t in (1.0, 5.0, 9.9):
        live.beat(1, beat(int(t * 10)), now=t)
        live.beat(2, beat(int(t * 10)), now=t)
    live.beat(2, beat(200), now=11.0)
    assert live.check(11.9) == [1]
    assert live.silent_before(10.2, slack=0.1) == 1
    assert live.silent_before(9.7, slack=0.1) is None  # a failure before it went silent
    assert live.silent_before(9.85, slack=0.1) == 1  # a beat read up to one interval late


def test_no_lost_node_means_no_collateral() -> None:
    live = Liveness([1], timeout=2.0, now=0.0)
    live.beat(1, beat(1), now=1.0)
    live.done(1)
    assert live.silent_before(5.0, slack=0.1) is None


def test_the_first_node_to_go_silent_is_the_cause() -> None:
    live = Liveness([1, 2], timeout=2.0, now=0.0)
    live.beat(1, beat(1), now=3.0)
    live.beat(2, beat(1), now=2.0)
    live.check(10.0)
    assert live.silent_before(4.0, slack=0.0) == 2


@pytest.mark.parametrize("contract", [F, R])
def test_a_lost_node_before_the_failure_is_the_root_cause(contract: Contract) -> None:
    outcomes = [rk(0, 0, t=9.0, signalled=True), rk(1, 1, t=2.0)]  # rank 1: a peer error
    facts = agreement.stop_facts(stop_to_wire(StopRecord(
        StopKind.FAILURE, "rank 1 failed (exit 1)", "failure", None, 1.0, 0.0, origin_rank=1)))
    verdict = decide(outcomes, agreement.lost_first(facts, (2, (4, 5))), contract)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (2, 2, None)
    assert verdict.lost_node == 2 and verdict.collateral == (1,)
    assert verdict.rule_text == ("root cause: node 2 was lost (its supervisor went silent; its "
                                 "ranks 4, 5); rank 1 failed after it: collateral")
    assert decide(outcomes, facts, contract).deciding_rank == 1  # without the loss: rank 1


def test_a_lost_node_does_not_recast_a_cancel() -> None:
    facts = StopFacts(StopKind.CANCEL, signal.SIGTERM)
    assert agreement.lost_first(facts, (1, (1,))) == facts
