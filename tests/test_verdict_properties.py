"""Property tests of the verdict (SPEC §5, issue 12 item 9), deterministic (derandomized)."""

from __future__ import annotations

import signal
from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from forgelm_tui.verdict import (
    OUTCOME_CODES,
    Contract,
    RankEnding,
    StopFacts,
    StopKind,
    Verdict,
    decide,
)

PROPERTY = settings(derandomize=True, max_examples=150, deadline=None)
CODES = [0, 1, 2, 3, 4, 5, 6, 7, 17, 137, 255]
SIGNALS = [signal.SIGTERM, signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV, signal.SIGUSR1,
           signal.SIGINT, 40, 64]
CRASH = ("RuntimeError", "boom")
times = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@st.composite
def ending(draw: st.DrawFn, rank: int) -> RankEnding:
    died = draw(st.booleans())
    sig = draw(st.sampled_from(SIGNALS)) if died else None
    code = None if died else draw(st.sampled_from(CODES))
    signalled = draw(st.integers(0, 3)) == 0
    foreign = draw(st.integers(0, 5)) == 0
    return RankEnding(
        rank, code, sig, draw(times), signalled,
        foreign_stop=foreign, foreign_mono=draw(times) if foreign else float("inf"),
        forwarded_death=died and not signalled and draw(st.integers(0, 4)) == 0,
        crash=CRASH if code == 1 and draw(st.booleans()) else None,
        node_rank=0 if rank < 2 else draw(st.integers(0, 1)))


@st.composite
def runs(draw: st.DrawFn) -> list[RankEnding]:
    size = draw(st.integers(1, 6))
    endings = [draw(ending(rank)) for rank in range(size)]
    if draw(st.booleans()):  # often enough, rank 0 decided an outcome (collateral can follow)
        endings[0] = RankEnding(0, draw(st.sampled_from(sorted(OUTCOME_CODES))), None,
                                draw(times), False)
    return endings


@st.composite
def stops(draw: st.DrawFn, size: int = 6) -> StopFacts | None:
    if draw(st.booleans()):
        return None
    kind = draw(st.sampled_from([k for k in StopKind if k is not StopKind.NODE_LOST]))
    origin = draw(st.one_of(st.none(), st.integers(0, size - 1)))
    return StopFacts(kind, draw(st.one_of(st.none(), st.sampled_from(SIGNALS))), origin)


contracts = st.sampled_from(list(Contract))
# A stall stop that signalled every rank (rule 4, "stalled"): rare in the draws, so named here.
STALLED = ([RankEnding(r, None, signal.SIGTERM, 2.0, True) for r in range(2)],
           StopFacts(StopKind.STALL, signal.SIGTERM))


def _signals(endings: list[RankEnding], stop: StopFacts | None) -> set[int]:
    found = {e.signal for e in endings if e.signal is not None} | {int(signal.SIGTERM)}
    return found | ({stop.signal} if stop is not None and stop.signal else set())


@PROPERTY
@given(runs(), stops(), contracts, st.booleans())
@example(*STALLED, Contract.RAW, False)
def test_codes_are_always_in_the_contract(endings: list[RankEnding], stop: StopFacts | None,
                                          contract: Contract, rank0_decides: bool) -> None:
    verdict = decide(endings, stop, contract, rank0_decides=rank0_decides)
    if contract is Contract.FORGELM:
        assert 0 <= verdict.code <= 6
    else:
        own = {e.exit_code for e in endings if e.exit_code is not None}
        by_signal = {128 + s for s in _signals(endings, stop)}
        assert verdict.code in own | by_signal | {1, 2}
    assert verdict.deciding_rank is None or verdict.deciding_rank in {e.rank for e in endings}


@PROPERTY
@given(st.data(), runs(), stops(), contracts, st.booleans())
def test_the_order_ranks_are_listed_in_never_matters(data: st.DataObject,
                                                     endings: list[RankEnding],
                                                     stop: StopFacts | None, contract: Contract,
                                                     rank0_decides: bool) -> None:
    shuffled = data.draw(st.permutations(endings))
    assert (decide(shuffled, stop, contract, rank0_decides=rank0_decides)
            == decide(endings, stop, contract, rank0_decides=rank0_decides))


@PROPERTY
@given(st.data(), runs(), stops(), contracts, st.sampled_from(sorted(OUTCOME_CODES)),
       st.lists(st.tuples(st.floats(0.001, 50.0), st.sampled_from([2, 7, None])), min_size=1,
                max_size=4))
def test_collateral_end_times_never_change_the_result(
        data: st.DataObject, endings: list[RankEnding], stop: StopFacts | None,
        contract: Contract, outcome: int, late: list[tuple[float, int | None]]) -> None:
    """Rank 0 ends with an outcome at t=50 and more ranks fail after it (ForgeLM mode): in
    whatever order those end, the result is the same."""
    endings = [RankEnding(0, outcome, None, 50.0, False), *endings[1:]]
    endings += [RankEnding(len(endings) + i, code, None if code else signal.SIGABRT, 50.0 + d,
                           False) for i, (d, code) in enumerate(late)]
    verdict = decide(endings, stop, contract, rank0_decides=True)
    assert set(range(len(endings) - len(late), len(endings))) <= set(verdict.collateral)
    after = [e for e in endings if e.rank in verdict.collateral]
    new_times = data.draw(st.permutations([e.ended_mono for e in after]))
    moved = {e.rank: replace(e, ended_mono=t) for e, t in zip(after, new_times, strict=True)}
    again = decide([moved.get(e.rank, e) for e in endings], stop, contract, rank0_decides=True)
    assert (again.code, again.rule, again.collateral) == (
        verdict.code, verdict.rule, verdict.collateral)


def _expected_root(endings: list[RankEnding], rank0_decides: bool) -> RankEnding | None:
    """The earliest failure on its own; in ForgeLM mode, the earliest before rank 0's outcome
    exit (ranks on rank 0's node: another node's clock orders nothing)."""
    rank0 = min(endings, key=lambda e: e.rank)
    outcome = (not rank0.signalled_first and not rank0.forwarded_death
               and rank0.signal is None and rank0.exit_code in OUTCOME_CODES)
    candidates = [e for e in endings if e.failed_on_own and not (
        rank0_decides and outcome and e.rank != rank0.rank
        and e.node_rank == rank0.node_rank and e.ended_mono > rank0.ended_mono)]
    return min(candidates, key=lambda e: (e.ended_mono, e.rank), default=None)


@PROPERTY
@given(runs(), contracts, st.booleans())
def test_the_earliest_failure_on_its_own_wins(endings: list[RankEnding], contract: Contract,
                                              rank0_decides: bool) -> None:
    verdict = decide(endings, StopFacts(StopKind.FAILURE), contract,
                     rank0_decides=rank0_decides)
    root = _expected_root(endings, rank0_decides)
    if root is None:
        assert verdict.rule in (3, 4)
    else:
        assert (verdict.rule, verdict.deciding_rank) == (2, root.rank)


@PROPERTY
@given(st.integers(1, 5), st.sampled_from(sorted(OUTCOME_CODES)), times, times,
       st.sampled_from([2, 7, 1, None]), st.booleans())
def test_one_failure_among_outcomes(size: int, outcome: int, rank0_at: float, failed_at: float,
                                    failure: int | None, rank0_decides: bool) -> None:
    """Every rank ends with an outcome but one, which fails: before rank 0's outcome exit it is
    the root cause, after it (ForgeLM mode) it is collateral and rank 0's code stands."""
    endings = [RankEnding(r, outcome, None, rank0_at if r == 0 else 0.0, False)
               for r in range(size + 1)]
    sig = signal.SIGABRT if failure is None else None
    endings[-1] = RankEnding(size, failure, sig, failed_at, False)
    verdict = decide(endings, None, Contract.FORGELM, rank0_decides=rank0_decides)
    if rank0_decides and failed_at > rank0_at:
        assert (verdict.code, verdict.rule, verdict.collateral) == (outcome, 3, (size,))
    else:
        assert (verdict.rule, verdict.deciding_rank) == (2, size)
        assert verdict.code == (1 if failure == 1 else 2)


def _interrupted(endings: list[RankEnding]) -> bool:
    rank0 = min(endings, key=lambda e: e.rank)
    return rank0.signalled_first or any(e.forwarded_death or e.foreign_stop for e in endings)


@PROPERTY
@given(runs(), stops(), contracts, st.booleans())
@example(*STALLED, Contract.FORGELM, True)
def test_an_interrupted_run_never_reads_as_success(endings: list[RankEnding],
                                                   stop: StopFacts | None, contract: Contract,
                                                   rank0_decides: bool) -> None:
    verdict: Verdict = decide(endings, stop, contract, rank0_decides=rank0_decides)
    if _interrupted(endings):
        assert verdict.code != 0
    if verdict.code == 0:
        assert verdict.rule == 3
