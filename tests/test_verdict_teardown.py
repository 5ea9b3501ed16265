"""SPEC §5 rule 2, issue 12: failures after rank 0's outcome exit (collateral) and crashes."""

from __future__ import annotations

import json
import signal

from conftest import rk

from forgelm_tui.cluster import agreement
from forgelm_tui.cluster.wire import ending_from_wire, ending_to_wire
from forgelm_tui.engine.codec import decode, encode
from forgelm_tui.verdict import Contract, StopFacts, StopKind, Verdict, decide

F, R = Contract.FORGELM, Contract.RAW
ABRT, TERM = signal.SIGABRT, signal.SIGTERM
FAIL = StopFacts(StopKind.FAILURE)
CRASH = ("RuntimeError", "rank 1: boom")


def test_forgelm_mode_failure_after_rank0_outcome_is_collateral() -> None:
    endings = [rk(0, 4, t=1), rk(1, sig=ABRT, t=2)]
    verdict = decide(endings, StopFacts(StopKind.FAILURE, origin_rank=1), F, rank0_decides=True)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (4, 3, 0)
    assert verdict.collateral == (1,) and verdict.after_rank0_exit == (1,)
    assert verdict.disagreements == ()  # listed as collateral, not as a disagreement
    assert "collateral" in verdict.rule_text


def test_other_programs_keep_rule_2_and_mark_it() -> None:
    endings = [rk(0, 4, t=1), rk(1, sig=ABRT, t=2)]
    verdict = decide(endings, FAIL, F)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (2, 2, 1)
    assert verdict.collateral == () and verdict.after_rank0_exit == (1,)


def test_failure_before_rank0_exit_is_the_root_cause_in_forgelm_mode() -> None:
    endings = [rk(0, 4, t=2), rk(1, 2, t=1)]
    verdict = decide(endings, FAIL, F, rank0_decides=True)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (2, 2, 1)
    assert verdict.collateral == ()


def test_earliest_failure_before_rank0_exit_wins_over_later_collateral() -> None:
    endings = [rk(0, 0, t=2), rk(1, 7, t=1), rk(2, sig=ABRT, t=3)]
    verdict = decide(endings, FAIL, R, rank0_decides=True)
    assert (verdict.code, verdict.deciding_rank) == (7, 1)
    assert verdict.after_rank0_exit == (2,)


def test_rank0_stopped_or_failed_has_no_collateral() -> None:
    stopped = [rk(0, 0, t=1, signalled=True), rk(1, sig=ABRT, t=2)]
    assert decide(stopped, FAIL, F, rank0_decides=True).deciding_rank == 1
    failed = [rk(0, 2, t=1), rk(1, sig=ABRT, t=2)]
    verdict = decide(failed, FAIL, F, rank0_decides=True)
    assert verdict.deciding_rank == 0 and verdict.collateral == ()


def test_a_tie_is_not_after() -> None:
    endings = [rk(0, 4, t=1), rk(1, sig=ABRT, t=1)]
    assert decide(endings, FAIL, F, rank0_decides=True).deciding_rank == 1


def test_another_node_is_never_ordered_by_its_clock() -> None:
    """ended_mono of node 1 is node 1's clock: its failure stays a failure (conservative)."""
    endings = [rk(0, 4, t=1), rk(1, 4, t=2), rk(2, sig=ABRT, t=500, node=1), rk(3, 4, node=1)]
    verdict = decide(endings, StopFacts(StopKind.FAILURE, origin_rank=2), F, rank0_decides=True)
    assert (verdict.code, verdict.deciding_rank, verdict.collateral) == (2, 2, ())
    same_node = [rk(0, 4, t=1), rk(1, sig=ABRT, t=2), rk(2, 4, node=1)]
    assert decide(same_node, FAIL, F, rank0_decides=True).collateral == (1,)


def test_multinode_decide_global_passes_the_mode() -> None:
    finals = {0: {"endings": [ending_to_wire(rk(0, 4, t=1)), ending_to_wire(rk(1, sig=ABRT, t=2))]},
              1: {"endings": [ending_to_wire(rk(2, 4, t=9, node=1))]}}
    verdict = agreement.decide_global(finals, None, F, rank0_decides=True)
    assert (verdict.code, verdict.collateral) == (4, (1,))
    back = decode(Verdict, json.loads(json.dumps(encode(verdict))))
    assert back == verdict


def test_crash_is_2_under_forgelm_and_named() -> None:
    endings = [rk(0, sig=TERM, t=2, signalled=True), rk(1, 1, t=1, crash=CRASH)]
    verdict = decide(endings, FAIL, F)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (2, 2, 1)
    assert verdict.exception == CRASH
    assert "RuntimeError: rank 1: boom" in verdict.rule_text


def test_crash_keeps_1_under_raw_but_is_named() -> None:
    verdict = decide([rk(0, 1, crash=CRASH)], FAIL, R)
    assert verdict.code == 1 and "RuntimeError" in verdict.rule_text


def test_deliberate_exit_1_stays_a_config_error() -> None:
    verdict = decide([rk(0, 1), rk(1, sig=TERM, signalled=True)], FAIL, F)
    assert (verdict.code, verdict.name, verdict.exception) == (1, "EXIT_CONFIG_ERROR", None)


def test_crash_survives_the_wire() -> None:
    ending = rk(1, 1, crash=CRASH, node=2)
    assert ending_from_wire(ending_to_wire(ending)) == ending


def test_the_new_fields_round_trip_through_the_event_codec() -> None:
    from forgelm_tui.engine import codec
    from forgelm_tui.engine import events as ev

    verdict = decide([rk(0, 4, t=1), rk(1, 1, t=2, crash=CRASH), rk(2, 1, t=0.5, crash=CRASH)],
                     FAIL, F, rank0_decides=True)
    assert verdict.collateral == (1,) and verdict.exception == CRASH
    event = ev.VerdictReached(verdict, "/x/envelope.json")
    assert codec.from_wire(codec.to_wire(event)) == event
