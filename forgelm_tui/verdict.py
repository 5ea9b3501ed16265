"""The true exit code of a run (SPEC §5): pure functions from rank records to a verdict.

Nothing here touches a process, a clock or a file; every rule is table-tested.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from forgelm_tui.signames import signal_name

# ForgeLM's public exit-code contract (SPEC §1).
EXIT_CODES: dict[int, tuple[str, str, str]] = {
    0: ("EXIT_SUCCESS", "completed, gates passed", "continue"),
    1: ("EXIT_CONFIG_ERROR", "bad YAML / missing file / bad argument", "fail fast: fix config"),
    2: (
        "EXIT_TRAINING_ERROR",
        "runtime error (OOM, NaN, I/O, crash, signal)",
        "investigate logs",
    ),
    3: (
        "EXIT_EVAL_FAILURE",
        "benchmark or safety gate failed (auto-revert)",
        "do not promote",
    ),
    4: (
        "EXIT_AWAITING_APPROVAL",
        "model staged, require_human_approval: true",
        "request review",
    ),
    5: ("EXIT_WIZARD_CANCELLED", "wizard exited without writing a config", "no-op"),
    6: ("EXIT_INTEGRITY_FAILURE", "an artefact's integrity check failed", "page the owner"),
}

# Codes with which a rank may end on its own without the run having failed: they are outcomes
# (ForgeLM's main process decided them), so they never trigger a fail-fast stop.
OUTCOME_CODES = frozenset({0, 3, 4, 5, 6})

EXIT_CONFIG_ERROR = 1
MAX_SIGNAL = int(getattr(signal, "SIGRTMAX", 64))  # the highest signal number
EXIT_TRAINING_ERROR = 2


class Contract(StrEnum):
    """How codes outside ForgeLM's table are reported."""

    FORGELM = "forgelm"  # every code outside 0..6 becomes 2, as ForgeLM clamps
    RAW = "raw"  # codes kept; a signal death is 128+N, as a shell reports it


class StopKind(StrEnum):
    """Why the supervisor stopped the ranks."""

    CANCEL = "cancel"  # operator or an outside signal to the supervisor
    FAILURE = "failure"  # a rank failed on its own (fail fast)
    DRAIN = "drain"  # rank 0 ended with an outcome, the others outlived the drain window
    STALL = "stall"  # no rank showed progress for the stall timeout
    FORWARDED = "forwarded"  # a rank died of a signal forwarded to it (SIGUSR1, no handler)
    NODE_LOST = "node_lost"  # another node's supervisor went silent (multi-node, SPEC §8)
    MEMBERSHIP = "membership"  # a node joins an elastic run: every node's ranks start again


@dataclass(frozen=True)
class RankEnding:
    """The facts about how one rank ended, as the verdict needs them."""

    rank: int
    exit_code: int | None  # own exit status when it exited normally
    signal: int | None  # signal number when it died of a signal
    ended_mono: float  # monotonic seconds; orders failures
    signalled_first: bool  # the supervisor signalled it (stop or kill) before it ended
    foreign_stop: bool = False  # it reported a stop signal forgelm-tui had not sent
    foreign_mono: float = float("inf")  # when it reported that (orders "who got it first")
    forwarded_death: bool = False  # it died of a signal forgelm-tui forwarded to it
    # It died of the stop signal a scheduler sent every process of the step, in the same burst
    # as the supervisor's own copy (SPEC §10): part of the outside stop, rule 4.
    outside_death: bool = False
    # It died of an uncaught Python exception: (type, message), from its error file or the
    # traceback at the end of its stderr (engine/crash.py reads them; this module reads nothing).
    crash: tuple[str, str] | None = None
    node_rank: int = 0  # the machine whose monotonic clock ``ended_mono`` is on

    @property
    def failed_on_own(self) -> bool:
        """Ended in failure without the supervisor having signalled it first."""
        if self.signalled_first or self.forwarded_death or self.outside_death:
            return False
        if self.signal is not None:
            return True
        return self.exit_code not in OUTCOME_CODES


@dataclass(frozen=True)
class StopFacts:
    """The stop the supervisor made, if any."""

    kind: StopKind
    signal: int | None = None  # the signal that caused a cancel (SIGINT for the operator)
    # Multi-node: the rank whose failure began the agreed stop (the first writer of the stop
    # record). Ranks of different machines are never ordered by their clocks: this decides.
    origin_rank: int | None = None
    lost_node: int | None = None  # the node a node_lost stop names
    # The lost node went silent before the first failure elsewhere: those failures (a peer's
    # "Connection closed by peer") are its collateral, and the node is the cause (SPEC §10).
    lost_first: bool = False
    lost_ranks: tuple[int, ...] = ()  # the lost node's ranks, where known


@dataclass(frozen=True)
class Verdict:
    code: int
    name: str
    meaning: str
    ci_action: str
    rule: int
    rule_text: str
    deciding_rank: int | None
    disagreements: tuple[tuple[int, int], ...] = ()  # (rank, own code) differing from rank 0's
    # Ranks that failed after rank 0 had exited with an outcome code, in ForgeLM mode: teardown,
    # not a root cause; rank 0's code stands (docs/verdict.md).
    collateral: tuple[int, ...] = ()
    # Every rank that failed after rank 0's outcome exit, whatever the mode (the envelope marks
    # them; outside ForgeLM mode they are still failures, rule 2).
    after_rank0_exit: tuple[int, ...] = ()
    exception: tuple[str, str] | None = None  # the deciding rank's crash: (type, message)
    lost_node: int | None = None  # the root cause is this node's loss (rule 2, no rank)

    @property
    def label(self) -> str:
        """``4 AWAITING_APPROVAL``: the code and its short name, for views."""
        return f"{self.code} {self.name.removeprefix('EXIT_')}"

    @property
    def root_cause_rank(self) -> int | None:
        """The rank whose own failure decided the run (rule 2), if a rank did."""
        return self.deciding_rank if self.rule == 2 else None

    def rank_marks(self, rank: int) -> dict[str, bool]:
        """What the verdict says of one rank in the envelope's ``ranks`` (its marks)."""
        return {"collateral": rank in self.collateral,
                "failed_after_rank0_exit": rank in self.after_rank0_exit}


def describe(code: int) -> tuple[str, str, str]:
    """Name, meaning and CI action for any code the process may exit with."""
    if code in EXIT_CODES:
        return EXIT_CODES[code]
    if 128 < code <= 128 + MAX_SIGNAL:  # a shell's 128+N; 255 and the like are plain statuses
        sig_name = signal_name(code - 128)
        return (
            f"SIGNAL_{sig_name}",
            f"stopped by {sig_name} (128+{code - 128})",
            "investigate logs",
        )
    return ("EXIT_OTHER", f"exit status {code}", "investigate logs")


def rank_code(outcome: RankEnding, contract: Contract) -> int:
    """One rank's own status under a contract."""
    if outcome.signal is not None:
        return EXIT_TRAINING_ERROR if contract is Contract.FORGELM else 128 + outcome.signal
    code = outcome.exit_code if outcome.exit_code is not None else EXIT_TRAINING_ERROR
    if contract is Contract.FORGELM and outcome.crash is not None:
        return EXIT_TRAINING_ERROR  # exit 1 with a traceback crashed; ForgeLM's own 1 has none
    if contract is Contract.FORGELM and not 0 <= code <= 6:
        return EXIT_TRAINING_ERROR
    return code


def _make(
    code: int,
    rule: int,
    text: str,
    rank: int | None,
    disagreements: tuple[tuple[int, int], ...] = (),
) -> Verdict:
    name, meaning, action = describe(code)
    return Verdict(code, name, meaning, action, rule, text, rank, disagreements)


def _ended_with_outcome(rank0: RankEnding) -> bool:
    """Rank 0 exited on its own with an outcome code (it decided how the run ended)."""
    return (not rank0.signalled_first and not rank0.forwarded_death and rank0.signal is None
            and rank0.exit_code in OUTCOME_CODES and rank0.ended_mono != float("inf"))


def failed_after_rank0(rank0: RankEnding, failures: Sequence[RankEnding]) -> tuple[int, ...]:
    """The failures that came after rank 0's outcome exit, as far as a clock can tell.

    Only ranks on rank 0's own machine are compared: ``ended_mono`` is one machine's monotonic
    clock, meaningless on another. A failure on another node is never counted as after rank 0's
    exit (the conservative reading: a real failure is never hidden behind rank 0's outcome).
    """
    if not _ended_with_outcome(rank0):
        return ()
    return tuple(sorted(f.rank for f in failures if f.rank != rank0.rank
                        and f.node_rank == rank0.node_rank and f.ended_mono > rank0.ended_mono))


def _how(ending: RankEnding) -> str:
    if ending.signal:
        return f"signal {signal_name(ending.signal)}"
    if ending.crash is not None:
        kind, message = ending.crash
        return f"exit {ending.exit_code}, crashed: {kind}: {message}" if message else (
            f"exit {ending.exit_code}, crashed: {kind}")
    return f"exit {ending.exit_code}"


def prelaunch_failure() -> Verdict:
    """Rule 1: the supervisor's own input was bad; no rank was started."""
    return _make(EXIT_CONFIG_ERROR, 1, "pre-launch failure: no rank was started", None)


def decide(
    outcomes: Sequence[RankEnding],
    stop: StopFacts | None,
    contract: Contract = Contract.FORGELM,
    *,
    rank0_decides: bool = False,
) -> Verdict:
    """Resolve the run's true exit code from every rank's outcome (SPEC §5, rules 2-4).

    ``rank0_decides``: ForgeLM mode, where rank 0 alone decides the outcome: a failure after
    rank 0's outcome exit is collateral (teardown), listed in the verdict, not a root cause.
    """
    failures = sorted((o for o in outcomes if o.failed_on_own),
                      key=lambda o: (o.ended_mono, o.rank))
    if stop is not None and stop.kind is StopKind.NODE_LOST and (stop.lost_first
                                                                 or not failures):
        return _node_lost(stop, tuple(f.rank for f in failures))
    if not outcomes:
        return prelaunch_failure()
    rank0 = min(outcomes, key=lambda o: o.rank)
    after = failed_after_rank0(rank0, failures)
    collateral = after if rank0_decides else ()
    failures = [f for f in failures if f.rank not in collateral]
    if stop is not None and stop.origin_rank is not None:
        failures.sort(key=lambda o: o.rank != stop.origin_rank)  # stable: the origin first
    if failures:
        root = failures[0]
        verdict = _make(rank_code(root, contract), 2,
                        f"root cause: rank {root.rank} failed on its own ({_how(root)})",
                        root.rank)
        return replace(verdict, collateral=collateral, after_rank0_exit=after,
                       exception=root.crash)
    return replace(_outcome(rank0, outcomes, stop, contract, collateral),
                   collateral=collateral, after_rank0_exit=after)


def _outcome(rank0: RankEnding, outcomes: Sequence[RankEnding], stop: StopFacts | None,
             contract: Contract, collateral: tuple[int, ...]) -> Verdict:
    """No root cause: rule 4 if the run was interrupted, else rule 3 (rank 0's own code)."""
    interrupted = sorted(
        (o for o in outcomes if o.foreign_stop or o.forwarded_death or o.outside_death),
        key=lambda o: (o.foreign_mono if o.foreign_stop else o.ended_mono, o.ended_mono, o.rank),
    )
    if stop is not None and stop.kind is StopKind.STALL and rank0.signalled_first:
        return _make(EXIT_TRAINING_ERROR, 4, "stalled: no rank made progress", rank0.rank)
    if rank0.signalled_first or interrupted:
        return _stopped(rank0, interrupted, stop, contract)
    code = rank_code(rank0, contract)
    disagreements = tuple(
        (o.rank, rank_code(o, contract))
        for o in outcomes
        if o.rank != rank0.rank and not o.signalled_first and o.rank not in collateral
        and rank_code(o, contract) != code
    )
    text = f"rank {rank0.rank}'s own exit code"
    if collateral:
        text += (f"; {_ranks_text(collateral)} failed after rank {rank0.rank} had exited "
                 f"{rank0.exit_code}: collateral (teardown)")
    return _make(code, 3, text, rank0.rank, disagreements)


LostCause = tuple[int, tuple[int, ...]]  # a lost node and its ranks


def lost_first(facts: StopFacts | None, lost: LostCause | None) -> StopFacts | None:
    """A node went silent before the first failure elsewhere (cluster/link.py decides): the
    node is the cause, those failures its collateral (SPEC §10)."""
    if lost is None or facts is None or facts.kind not in (StopKind.FAILURE,
                                                            StopKind.NODE_LOST):
        return facts
    node, ranks = lost
    return replace(facts, kind=StopKind.NODE_LOST, lost_node=node, lost_first=True,
                   lost_ranks=ranks)


def _node_lost(stop: StopFacts, collateral: tuple[int, ...]) -> Verdict:
    """Rule 2 with a node, not a rank, as the root cause; what failed after it: collateral."""
    ranks = f"; its {_ranks_text(stop.lost_ranks)}" if stop.lost_ranks else ""
    text = f"root cause: node {stop.lost_node} was lost (its supervisor went silent{ranks})"
    if collateral:
        text += f"; {_ranks_text(collateral)} failed after it: collateral"
    return replace(_make(EXIT_TRAINING_ERROR, 2, text, None), collateral=collateral,
                   lost_node=stop.lost_node)


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _stopped(
    rank0: RankEnding,
    interrupted: Sequence[RankEnding],
    stop: StopFacts | None,
    contract: Contract,
) -> Verdict:
    """Rule 4: the run was stopped before it completed, whatever the ranks exited with after."""
    first = interrupted[0] if interrupted else None
    if first is not None and first.forwarded_death and first.signal is not None:
        deciding = first.rank
        text = (f"interrupted: rank {deciding} ended on {signal_name(first.signal)}, "
                "forwarded by forgelm-tui")
        sig: int = first.signal
    elif first is not None and not rank0.signalled_first:
        deciding = first.rank
        text = f"interrupted: rank {deciding} stopped on a signal from outside"
        sig = signal.SIGTERM
        if first.outside_death and first.signal is not None:
            text = (f"interrupted: rank {deciding} ended on {signal_name(first.signal)} from "
                    "outside, with the supervisor's")
            sig = first.signal
    else:
        deciding = rank0.rank
        kind = stop.kind.value if stop else "stop"
        text = f"interrupted: rank {deciding} was stopped by the supervisor ({kind})"
        sig = stop.signal if stop and stop.signal else int(signal.SIGTERM)
    code = EXIT_TRAINING_ERROR if contract is Contract.FORGELM else 128 + int(sig)
    return _make(code, 4, text, deciding)
