"""SPEC §5 as a table: every rule under both contracts."""

from __future__ import annotations

import signal

import pytest
from conftest import rk

from forgelm_tui.verdict import (
    Contract,
    RankEnding,
    StopFacts,
    StopKind,
    decide,
    describe,
    prelaunch_failure,
)

F, R = Contract.FORGELM, Contract.RAW
TERM, KILL, INT, USR1 = signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGUSR1


CANCEL_INT = StopFacts(StopKind.CANCEL, INT)
CANCEL_TERM = StopFacts(StopKind.CANCEL, TERM)
FAIL = StopFacts(StopKind.FAILURE)

# (name, outcomes, stop, contract, code, rule, deciding rank)
TABLE = [
    ("all succeed", [rk(0, 0), rk(1, 0)], None, F, 0, 3, 0),
    ("all await approval", [rk(0, 4), rk(1, 4)], None, F, 4, 3, 0),
    ("gate failed on rank 0", [rk(0, 3), rk(1, 0)], None, F, 3, 3, 0),
    ("wizard cancelled", [rk(0, 5), rk(1, 5)], None, F, 5, 3, 0),
    ("integrity failure", [rk(0, 6), rk(1, 6)], None, R, 6, 3, 0),
    ("rank 1 outcome does not override rank 0", [rk(0, 0, t=2), rk(1, 4, t=1)], None, F, 0, 3, 0),
    ("rank 1 fails, rank 0 stopped",
     [rk(0, sig=TERM, t=2, signalled=True), rk(1, 2, t=1)], FAIL, F, 2, 2, 1),
    ("earliest failure wins",
     [rk(0, 1, t=3), rk(1, 2, t=1), rk(2, 6, t=0.5)], FAIL, F, 2, 2, 1),
    ("tie broken by rank", [rk(0, 0), rk(1, 7, t=1), rk(2, 2, t=1)], FAIL, R, 7, 2, 1),
    ("config error on rank 0", [rk(0, 1), rk(1, sig=TERM, signalled=True)], FAIL, F, 1, 2, 0),
    ("crash code clamped", [rk(0, 17), rk(1, 0)], FAIL, F, 2, 2, 0),
    ("crash code kept raw", [rk(0, 17), rk(1, 0)], FAIL, R, 17, 2, 0),
    ("oom-killed rank (outside SIGKILL)", [rk(0, 0, t=2), rk(1, sig=KILL, t=1)], FAIL, F, 2, 2, 1),
    ("oom-killed rank raw", [rk(0, 0, t=2), rk(1, sig=KILL, t=1)], FAIL, R, 137, 2, 1),
    ("ctrl+c cancel forgelm",
     [rk(0, sig=TERM, signalled=True), rk(1, sig=TERM, signalled=True)], CANCEL_INT, F, 2, 4, 0),
    ("ctrl+c cancel raw",
     [rk(0, sig=TERM, signalled=True), rk(1, sig=TERM, signalled=True)], CANCEL_INT, R, 130, 4, 0),
    ("scheduler sigterm raw",
     [rk(0, 0, signalled=True), rk(1, 0, signalled=True)], CANCEL_TERM, R, 143, 4, 0),
    ("ranks exit 0 after a stop: not success",
     [rk(0, 0, signalled=True), rk(1, 0, signalled=True)], CANCEL_TERM, F, 2, 4, 0),
    ("graceful forgelm exit 2 after stop", [rk(0, 2, signalled=True)], CANCEL_TERM, F, 2, 4, 0),
    ("lightning rank reports outside sigterm",
     [rk(0, 0, t=2), rk(1, 0, t=1, outside=True)], None, F, 2, 4, 1),
    ("outside sigterm raw", [rk(0, 0), rk(1, 0, outside=True)], None, R, 143, 4, 1),
    ("stall", [rk(0, sig=TERM, signalled=True), rk(1, sig=KILL, signalled=True)],
     StopFacts(StopKind.STALL), F, 2, 4, 0),
    ("stall raw is still 2", [rk(0, sig=TERM, signalled=True)], StopFacts(StopKind.STALL), R, 2,
     4, 0),
    ("drain timeout keeps rank 0's code",
     [rk(0, 4, t=1), rk(1, sig=TERM, t=5, signalled=True)], StopFacts(StopKind.DRAIN), F, 4, 3, 0),
    ("cancel after rank 0 finished keeps its code",
     [rk(0, 4, t=1), rk(1, 0, t=5, signalled=True)], CANCEL_INT, F, 4, 3, 0),
    ("rank killed by signal 40, unnamed by Python", [rk(0, 0, t=2), rk(1, sig=40, t=1)], FAIL, R,
     168, 2, 1),
    ("forwarded SIGUSR1 killed rank 0: interrupted, not a failure",
     [rk(0, sig=USR1, t=1, forwarded=True), rk(1, sig=TERM, t=2, signalled=True)],
     StopFacts(StopKind.FORWARDED, USR1), F, 2, 4, 0),
    ("forwarded SIGUSR1 raw is 128+10",
     [rk(0, 0, t=3), rk(1, sig=USR1, t=1, forwarded=True)], StopFacts(StopKind.FORWARDED, USR1),
     R, 138, 4, 1),
    ("killed by supervisor after ignoring sigterm",
     [rk(0, sig=KILL, signalled=True)], CANCEL_INT, R, 130, 4, 0),
]


@pytest.mark.parametrize(("name", "outcomes", "stop", "contract", "code", "rule", "rank"),
                         TABLE, ids=[row[0] for row in TABLE])
def test_verdict_table(name: str, outcomes: list[RankEnding], stop: StopFacts | None,
                       contract: Contract, code: int, rule: int, rank: int) -> None:
    verdict = decide(outcomes, stop, contract)
    assert (verdict.code, verdict.rule, verdict.deciding_rank) == (code, rule, rank)


def test_prelaunch_is_rule_1() -> None:
    verdict = prelaunch_failure()
    assert (verdict.code, verdict.rule, verdict.name) == (1, 1, "EXIT_CONFIG_ERROR")
    assert decide([], None).rule == 1


def test_disagreements_are_reported() -> None:
    verdict = decide([rk(0, 4), rk(1, 0), rk(2, 4)], None)
    assert verdict.disagreements == ((1, 0),)


def test_names_and_labels() -> None:
    assert decide([rk(0, 4)], None).label == "4 AWAITING_APPROVAL"
    assert describe(143)[0] == "SIGNAL_SIGTERM"
    assert describe(2)[2] == "investigate logs"
    assert describe(77)[0] == "EXIT_OTHER"
    assert describe(128 + 40)[0] == "SIGNAL_SIGRTMIN+6"
    assert describe(128 + 64)[0] == "SIGNAL_SIGRTMAX"
    # exit(255) is a status, not a signal 127 (the soak's finding): named as a plain code
    assert describe(255) == ("EXIT_OTHER", "exit status 255", "investigate logs")
    assert describe(193)[0] == "EXIT_OTHER"
    assert "SIGRTMIN+6" in decide([rk(0, 0, t=2), rk(1, sig=40, t=1)], FAIL).rule_text
