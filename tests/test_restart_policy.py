"""The restart policy, pure (engine/restart_policy.py): which endings a restart can fix."""

from __future__ import annotations

import pytest

from forgelm_tui.engine.restart_policy import (
    AttemptFacts,
    RestartDecision,
    backoff,
    decide_restart,
)
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(10)

FAIL = StopKind.FAILURE
REASON = "rank 1 failed (exit 2)"

# (code, rule, stop kind, cancelled, supervisor error, launch error) -> restarted?
TABLE = [
    ("crash: a rank failed on its own", 2, 2, FAIL, False, False, False, True),
    ("a signal forgelm-tui did not send (raw)", 139, 2, FAIL, False, False, False, True),
    ("a code outside the contract (raw)", 7, 2, FAIL, False, False, False, True),
    ("a lone rank failed: no stop to make", 2, 2, None, False, False, False, True),
    ("a stall", 2, 4, StopKind.STALL, False, False, False, True),
    ("success", 0, 3, None, False, False, False, False),
    ("config error (rule 2 under raw)", 1, 2, FAIL, False, False, False, False),
    ("config error from rank 0", 1, 3, None, False, False, False, False),
    ("gate failed", 3, 3, None, False, False, False, False),
    ("awaiting approval", 4, 3, StopKind.DRAIN, False, False, False, False),
    ("wizard cancelled", 5, 3, None, False, False, False, False),
    ("integrity failure", 6, 3, None, False, False, False, False),
    ("operator cancel", 2, 4, StopKind.CANCEL, True, False, False, False),
    ("cancel (raw, SIGTERM)", 143, 4, StopKind.CANCEL, True, False, False, False),
    ("a cancel during a failure's stop", 2, 2, FAIL, True, False, False, False),
    ("a forwarded signal ended a rank", 2, 4, StopKind.FORWARDED, False, False, False, False),
    ("a rank reported an outside stop", 2, 4, None, False, False, False, False),
    ("drain window after rank 0's outcome", 2, 4, StopKind.DRAIN, False, False, False, False),
    ("a lost node", 2, 2, StopKind.NODE_LOST, False, False, False, False),
    ("forgelm-tui itself failed", 2, 4, StopKind.CANCEL, True, True, False, False),
    ("supervisor error after the ranks failed", 2, 2, FAIL, False, True, False, False),
    ("launch failure", 1, 1, FAIL, False, False, True, False),
]


@pytest.mark.parametrize(("name", "code", "rule", "kind", "cancelled", "error", "launch",
                          "restarted"), TABLE, ids=[row[0] for row in TABLE])
def test_restart_table(name: str, code: int, rule: int, kind: StopKind | None, cancelled: bool,
                       error: bool, launch: bool, restarted: bool) -> None:
    facts = AttemptFacts(code, rule, kind, REASON, cancelled, error, launch)
    decision = decide_restart(facts, 0, 3)
    assert decision.restart is restarted, decision.why
    if restarted:
        assert decision.why == f"restarting after {REASON}"


def test_no_restart_past_max_restarts() -> None:
    facts = AttemptFacts(2, 2, FAIL, REASON)
    assert [decide_restart(facts, attempt, 2).restart for attempt in range(4)] == [
        True, True, False, False]
    assert decide_restart(facts, 2, 2).why == "no restart left (--max-restarts 2)"
    assert decide_restart(facts, 0, 0).restart is False  # the default: never


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff(1.0, n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff(0.0, 3) == 0.0
    assert backoff(0.25, 2) == 0.5


LOST = "node 2 lost: no heartbeat for 3 s"


@pytest.mark.parametrize(("left", "low", "attempt", "restart", "why"), [
    (2, 2, 0, True, f"restarting with 2 node(s) after {LOST}"),  # elastic, MIN left
    (3, 2, 0, True, f"restarting with 3 node(s) after {LOST}"),
    (1, 2, 0, False, f"{LOST}; 1 node(s) left, fewer than the 2 --nnodes needs"),
    (2, 2, 2, False, "no restart left (--max-restarts 2)"),
    (None, 0, 0, False, f"not a failure a restart can fix ({LOST})"),  # a fixed node count
])
def test_a_lost_node_restarts_an_elastic_run_only_with_min_nodes_left(
        left: int | None, low: int, attempt: int, restart: bool, why: str) -> None:
    facts = AttemptFacts(2, 2, StopKind.NODE_LOST, LOST, nodes_left=left, min_nodes=low)
    assert decide_restart(facts, attempt, 2) == RestartDecision(restart, why)
