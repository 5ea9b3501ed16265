"""Whether an attempt that ended is started again (``--max-restarts``): pure, table-tested.

A restart can fix what the ranks did not decide: a crash or a signal forgelm-tui did not send
(rule 2: a rank failed on its own), or a stall (rule 4 after a stall stop). It never follows:

- an outcome or a config error: the run's code 0, 1, 3, 4, 5 or 6 (under either contract; a
  rank that decided its run ended would decide it again, and a gate that failed or a model
  awaiting approval must not train again from the start);
- a cancel of any source (the operator, a signal to the supervisor, a viewer, a lost terminal);
- a forwarded signal that ended a rank, or a rank that reported a stop signal from outside
  (the run was interrupted on purpose);
- the drain window (rank 0 had ended with an outcome), a lost node (unless the run is elastic,
  ``--nnodes MIN:MAX``, and at least MIN nodes are left), a launch that failed, or an error of
  forgelm-tui itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from forgelm_tui.verdict import StopKind

NEVER_RESTARTED = frozenset({0, 1, 3, 4, 5, 6})
BACKOFF_CAP = 30.0  # seconds: the longest wait between two attempts


@dataclass(frozen=True)
class AttemptFacts:
    """How one attempt ended, as far as restarting it is concerned."""

    code: int  # its verdict's code
    rule: int  # its verdict's rule (SPEC §5)
    stop_kind: StopKind | None  # the stop the supervisor made, if any
    reason: str  # what ended it, in the operator's words (the stop's reason, else the rule's)
    cancelled: bool = False  # any cancel request, from any source
    supervisor_error: bool = False
    launch_error: bool = False
    # An elastic run (--nnodes MIN:MAX) that lost nodes: the nodes left, and MIN
    nodes_left: int | None = None
    min_nodes: int = 0


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    why: str  # "restarting after ..." or why not
    counted: bool = True  # against --max-restarts (a node joining an elastic run is not)


def decide_restart(facts: AttemptFacts, attempt: int, max_restarts: int) -> RestartDecision:
    """``attempt``: how many counted restarts came before the attempt that ended."""
    if facts.launch_error:
        return RestartDecision(False, "the ranks could not be started")
    if facts.supervisor_error:
        return RestartDecision(False, "forgelm-tui itself failed")
    if facts.cancelled:
        return RestartDecision(False, "the run was cancelled")
    if facts.code == 0:
        return RestartDecision(False, "the run succeeded")
    if facts.code in NEVER_RESTARTED:
        return RestartDecision(False, f"exit {facts.code} is the run's own outcome; a restart "
                                      "would not change it")
    if facts.stop_kind is StopKind.MEMBERSHIP:  # as torchrun's agents: never counted
        return RestartDecision(True, f"re-forming the run: {facts.reason}", counted=False)
    if facts.stop_kind is StopKind.FORWARDED:
        return RestartDecision(False, "a forwarded signal ended a rank")
    fixable = facts.rule == 2 or (facts.rule == 4 and facts.stop_kind is StopKind.STALL)
    if facts.stop_kind is StopKind.NODE_LOST and facts.nodes_left is not None:
        if facts.nodes_left < facts.min_nodes:
            return RestartDecision(False, f"{facts.reason}; {facts.nodes_left} node(s) left, "
                                          f"fewer than the {facts.min_nodes} --nnodes needs")
        return _left(attempt, max_restarts, f"restarting with {facts.nodes_left} node(s) "
                                            f"after {facts.reason}")
    if not fixable or facts.stop_kind in (StopKind.DRAIN, StopKind.NODE_LOST):
        return RestartDecision(False, f"not a failure a restart can fix ({facts.reason})")
    return _left(attempt, max_restarts, f"restarting after {facts.reason}")


def _left(attempt: int, max_restarts: int, why: str) -> RestartDecision:
    if attempt >= max_restarts:
        return RestartDecision(False, f"no restart left (--max-restarts {max_restarts})")
    return RestartDecision(True, why)


def backoff(first: float, restart: int) -> float:
    """The wait before restart number ``restart`` (1, 2...): ``first``, doubled each time,
    at most BACKOFF_CAP."""
    return min(BACKOFF_CAP, first * 2.0 ** max(0, restart - 1))
