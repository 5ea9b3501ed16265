"""A run's outcome, typed: built once from the records, the verdict and the plan; merged across
nodes as outcomes; serialised last, by envelope/build.py (SPEC §6, §8).

As torch's ``RunResult``: each node makes its :class:`NodeOutcome` from its own records (the
only place they are read: ``node_outcome``); node 0 merges every node's into one
:class:`RunOutcome` with the agreed verdict and stop, and publishes it; every node serialises
that same outcome with its own node-local facts (its node rank, run dir, command). Nothing is
written into an envelope once it is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from forgelm_tui.engine.records import (
    CancelRequest,
    DescendantRecord,
    ForwardRequest,
    RankRecord,
    StopRecord,
)
from forgelm_tui.engine.restart_policy import RestartDecision
from forgelm_tui.envelope import entries
from forgelm_tui.envelope.gpu import last_gpu_sample
from forgelm_tui.envelope.storage import storage_section
from forgelm_tui.verdict import Verdict

Json = dict[str, Any]

# The fields of an attempt's own envelope that its entry in ``attempts`` keeps.
ATTEMPT_FIELDS = ("started_at", "ended_at", "duration_s", "exit_code", "exit_name",
                  "decided_by", "root_cause_rank", "error", "cancelled", "stop", "run_dir",
                  "supervisor_error", "ranks", "nnodes", "world_size", "nodes")


@dataclass(frozen=True)
class Attempt:
    """One element of the envelope's ``attempts``: what its own envelope said, and whether the
    run went on to another attempt."""

    attempt: int
    fields: Json  # ATTEMPT_FIELDS of the attempt's own envelope
    restart: RestartDecision | None = None
    backoff: float | None = None  # the wait before the next attempt, when there was one

    def as_dict(self) -> Json:
        return {"attempt": self.attempt, **self.fields,
                "restart": None if self.restart is None else {
                    "restarted": self.restart.restart, "why": self.restart.why,
                    "backoff_s": self.backoff}}


@dataclass(frozen=True)
class Restarts:
    """The run beyond the attempt an envelope describes (``--max-restarts``)."""

    max_restarts: int = 0
    restart_count: int = 0
    attempts: tuple[Attempt, ...] = ()


@dataclass(frozen=True)
class RunFrame:
    """When the run (or the attempt) ran, its pre-launch error, an error of forgelm-tui itself,
    its restarts (None: an attempt's own envelope, its ``attempts`` entry) and the settings it
    ran with: on several nodes, node 0's, for every node's copy."""

    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    supervisor_error: Json | None = None
    restarts: Restarts | None = None
    provisional: bool = False
    settings: Json | None = None  # the deciding node's (``settings_entry``); None: the writer's

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return round(self.ended_at - self.started_at, 3)


@dataclass(frozen=True)
class NodeOutcome:
    """One node's part of the outcome, made where its records are: its ranks' entries and what
    its supervisor got. Travels to node 0 as JSON (engine/codec.py)."""

    node_rank: int
    host: str | None = None
    pid: int | None = None
    run_dir: str | None = None
    ranks: tuple[Json, ...] = ()  # entries.rank_entry, without the verdict's marks
    gpu_samples: tuple[Json, ...] = ()  # each rank's last GPU sample (the root cause's is shown)
    cancels: tuple[Json, ...] = ()
    cancelled: Json | None = None  # the first cancel (or one between two attempts)
    forwards: tuple[Json, ...] = ()
    descendants: tuple[Json, ...] = ()
    outside_signal: Json | None = None
    storage: Json | None = None
    result: Json | None = None  # rank 0's ForgeLM result, on rank 0's node
    launch_error: str | None = None


@dataclass(frozen=True)
class Agreement:
    """How a multi-node verdict was reached: agreed by node 0, or decided alone and why."""

    agreed: bool
    decided_by_node: int
    nodes_lost: tuple[int, ...] = ()
    nnodes: int = 1
    note: str | None = None

    def as_dict(self) -> Json:
        if self.agreed:
            return {"agreed": True, "decided_by_node": self.decided_by_node,
                    "nodes_lost": list(self.nodes_lost)}
        return {"agreed": False, "decided_by_node": self.decided_by_node, "note": self.note}


@dataclass(frozen=True)
class RunOutcome:
    """The run's outcome: its verdict, every node's part (the deciding node's first), the
    run's stop (the agreed one on several nodes) and why a scheduler stopped it."""

    verdict: Verdict
    frame: RunFrame
    nodes: tuple[NodeOutcome, ...] = ()
    stop: StopRecord | None = None
    scheduler: Json | None = None
    agreement: Agreement | None = None

    @property
    def merged(self) -> bool:
        """Every node's parts, agreed: entries say their node, the envelope lists the nodes."""
        return self.agreement is not None and self.agreement.agreed


def node_outcome(node_rank: int, records: Iterable[RankRecord], *,
                 cancels: Sequence[CancelRequest] = (),
                 cancel_between: CancelRequest | None = None,
                 forwards: Sequence[ForwardRequest] = (),
                 descendants: Sequence[DescendantRecord] = (),
                 results: dict[int, Json] | None = None, launch_error: str | None = None,
                 where: tuple[str | None, int | None, str | None] = (None, None, None),
                 ) -> NodeOutcome:
    """A node's part from its own records, each entry serialised once (envelope/entries.py).
    ``where``: its host, supervisor pid and run dir, for the envelope's ``nodes``."""
    results = results or {}
    ranks = sorted(records, key=lambda r: r.rank)
    cancelled = (entries.cancelled_entry(cancels[0], len(cancels)) if cancels else
                 None if cancel_between is None else entries.cancelled_entry(cancel_between, 1))
    samples = (last_gpu_sample(r) for r in ranks)
    host, pid, run_dir = where
    return NodeOutcome(
        node_rank=node_rank, host=host, pid=pid, run_dir=run_dir,
        ranks=tuple(entries.rank_entry(r, results.get(r.rank)) for r in ranks),
        gpu_samples=tuple(s for s in samples if s is not None),
        cancels=tuple(entries.cancel_entry(c) for c in cancels), cancelled=cancelled,
        forwards=tuple(entries.forward_entry(f) for f in forwards),
        descendants=tuple(entries.descendant_entry(d) for d in descendants),
        outside_signal=entries.outside_signal(ranks), storage=storage_section(ranks),
        result=results.get(0), launch_error=launch_error)
