"""Restarts across nodes (``--max-restarts`` with ``--nnodes`` > 1): one decision for the run.

When every node's ranks of an attempt have ended, node 0 decides the attempt's verdict (as
for any multi-node run) and, from that agreed verdict and stop, whether the run restarts
(engine/restart_policy.py, the single-node rule, unchanged) and after how long. It publishes
both in one record (the attempt's ``verdict`` key); every node reads the same record, keeps the
same entry in its envelope's ``attempts`` and restarts, or ends, with every other node. No
node decides a restart on its own: a node that cannot read node 0's decision ends the run
("decided without agreement"). Pure but for the supervisor's facts read here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from forgelm_tui.cluster.store import ControlStore, StoreLost, StoreTimeout
from forgelm_tui.engine.codec import decode, encode
from forgelm_tui.engine.restart_policy import AttemptFacts, RestartDecision, backoff, decide_restart
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.envelope import build as env_mod
from forgelm_tui.plan.planner import Plan, RunInfo
from forgelm_tui.session.outcome import ATTEMPT_FIELDS, Attempt, Restarts, RunOutcome
from forgelm_tui.verdict import StopKind


@dataclass(frozen=True)
class ClosedAttempt:
    """An attempt as node 0 closed it: its agreed outcome (its own times, no restarts), the
    decision, the wait before the next attempt, and when the run (its first attempt) began."""

    outcome: RunOutcome
    decision: RestartDecision
    delay: float
    started_at: float | None

    def entry(self, info: RunInfo, run_dir: str) -> Attempt:
        """This attempt's element of ``attempts``, on a node whose attempt dir is ``run_dir``
        (the one node-local field of an entry, as the envelope's own ``run_dir``)."""
        own = env_mod.build(info, self.outcome, run_dir=run_dir)
        fields = {name: own.get(name) for name in ATTEMPT_FIELDS}
        restarted = self.decision.restart
        return Attempt(self.attempt, fields, self.decision, self.delay if restarted else None)

    @property
    def attempt(self) -> int:
        restarts = self.outcome.frame.restarts
        return 0 if restarts is None else restarts.restart_count

    def to_wire(self) -> dict[str, Any]:
        return {"outcome": encode(self.outcome), "started_at": self.started_at,
                "restart": {"restart": self.decision.restart, "why": self.decision.why,
                            "counted": self.decision.counted, "delay": self.delay}}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ClosedAttempt:
        restart = data["restart"]
        return cls(decode(RunOutcome, data["outcome"]),
                   RestartDecision(bool(restart["restart"]), str(restart["why"]),
                                   bool(restart.get("counted", True))),
                   float(restart["delay"]), data["started_at"])


def decide_attempt(outcome: RunOutcome, sup: Supervisor, plan: Plan,
                   run_started: float | None) -> ClosedAttempt:
    """Node 0: the agreed outcome of the attempt under way -> restart or not, once for all.
    The facts are every node's: a cancel or a launch that failed anywhere is never
    restarted; an error of forgelm-tui itself is node 0's (another node's is a stop)."""
    stop, verdict, agreed = outcome.stop, outcome.verdict, outcome.agreement
    index = sup.spec.restart_count
    elastic = plan.cluster is not None and plan.cluster.elastic and agreed is not None
    kind, reason = (stop.kind, stop.reason) if stop else (None, verdict.rule_text)
    if agreed is not None and agreed.nodes_lost and kind is not StopKind.MEMBERSHIP:
        # a lost node, whatever its loss made fail first (a peer's "Connection closed")
        lost = ", ".join(map(str, agreed.nodes_lost))
        kind, reason = StopKind.NODE_LOST, reason if kind is StopKind.NODE_LOST else (
            f"node {lost} lost ({verdict.rule_text})")
    facts = AttemptFacts(
        code=verdict.code, rule=verdict.rule, stop_kind=kind, reason=reason,
        cancelled=any(n.cancels or n.cancelled for n in outcome.nodes),
        supervisor_error=sup.faults.error is not None,
        launch_error=any(n.launch_error for n in outcome.nodes),
        nodes_left=agreed.nnodes - len(agreed.nodes_lost) if elastic and agreed else None,
        min_nodes=plan.cluster.min_nodes if plan.cluster is not None else 0)
    used = sup.spec.restarts_used
    decision = decide_restart(facts, used, plan.spec.max_restarts)
    delay = (backoff(plan.info.restart_backoff, used + 1) if decision.counted else 0.0) \
        if decision.restart else 0.0
    frame = replace(outcome.frame, started_at=sup.started_at, ended_at=sup.ended_at,
                    restarts=Restarts(plan.spec.max_restarts, index))
    return ClosedAttempt(replace(outcome, frame=frame), decision, delay, run_started)


def run_outcome(outcome: RunOutcome, attempts: Sequence[Attempt],
                max_restarts: int, started_at: float | None, *, provisional: bool,
                cancelled: dict[str, Any] | None, scheduler: dict[str, Any] | None,
                ) -> RunOutcome:
    """The run's outcome on every node: the last attempt's agreed outcome, the run's start,
    every attempt's entry; a cancel during the backoff as the run's ``cancelled``."""
    nodes = outcome.nodes
    if cancelled is not None and nodes:
        nodes = (replace(nodes[0], cancelled=cancelled), *nodes[1:])
    frame = replace(outcome.frame, started_at=started_at or outcome.frame.started_at,
                    provisional=provisional,
                    restarts=Restarts(max_restarts, attempts[-1].attempt, tuple(attempts)))
    return replace(outcome, frame=frame, nodes=nodes,
                   scheduler=outcome.scheduler or scheduler)


# ---------------------------------------------------------------------- the store's side


def first_record(store: ControlStore, key: str) -> dict[str, Any] | None:
    """A first-writer-wins record (the agreed stop, the first failure), if any was written."""
    try:
        return store.get(key) if store.has([key]) else None
    except (StoreLost, StoreTimeout):
        return None


def publish_verdict(store: ControlStore, closed: ClosedAttempt, waiting: int,
                     wait: float) -> None:
    store.set("verdict", closed.to_wire())
    store.broadcast({"kind": "verdict"})
    deadline = time.monotonic() + wait  # ClusterConfig.ack_wait (--rdzv-conf close_timeout)
    while store.add("acks", 0) < waiting and time.monotonic() < deadline:
        time.sleep(0.02)  # node 0 exits last: its store must outlive the others' reads


def ack(store: ControlStore) -> None:
    with contextlib.suppress(StoreLost, StoreTimeout):
        store.add("acks", 1)


def read_verdict(store: ControlStore) -> dict[str, Any] | None:
    try:
        if not store.has(["verdict"]):
            return None
        published: dict[str, Any] = store.get("verdict")
        return published
    except (StoreLost, StoreTimeout):
        return None
