"""The JSON envelope (SPEC §6): a run's typed outcome (session/outcome.py) serialised, in one
place. Single-node, an attempt's own, or every node's agreed outcome: the same function, with
the node-local facts of the node that writes it (its run dir, node rank, command).

Every field is documented in docs/envelope.md. No environment values ever go in: they may hold
secrets.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Any

from forgelm_tui import __version__
from forgelm_tui.engine import hang
from forgelm_tui.envelope import storage
from forgelm_tui.envelope.entries import stop_entry, verdict_dict
from forgelm_tui.isotime import iso
from forgelm_tui.plan.planner import RunInfo
from forgelm_tui.redact import redact_argv, redact_text
from forgelm_tui.session.outcome import NodeOutcome, Restarts, RunFrame, RunOutcome
from forgelm_tui.verdict import StopKind, Verdict

SCHEMA = "forgelm-tui/envelope/v1"
Json = dict[str, Any]


def _launch(info: RunInfo) -> Json:
    """The launch's facts: the spec's once there is one; before, what the planner knew."""
    spec = info.spec
    if spec is None:
        return {"rank_command": [], "launcher": None, "world_size": 0, "nproc_per_node": 0,
                "nnodes": info.nnodes,
                "node_rank": info.node_rank, "master_addr": None, "master_port": None}
    launcher = None if info.launcher is None else {
        "name": info.launcher, "rank_env": spec.env_style,
        "local_rank_arg": spec.local_rank_at is not None}
    return {"rank_command": redact_argv(spec.argv), "launcher": launcher,
            "world_size": spec.world_size,
            "nproc_per_node": spec.nproc_per_node, "nnodes": spec.nnodes,
            "node_rank": spec.node_rank, "master_addr": spec.master_addr,
            "master_port": spec.master_port}


def settings_entry(info: RunInfo) -> Json:
    """``settings``: the stop's settings the run was launched with."""
    return {
        "grace_s": info.grace,
        "grace_source": info.grace_source,
        "kill_window_s": info.kill_window,
        "drain_s": info.spec.drain if info.spec else None,
        "stall_timeout_s": info.spec.stall_timeout if info.spec else None,
        "graceful": info.graceful,
        "collective_trace": info.collective_trace,
    }


def build(info: RunInfo, outcome: RunOutcome, *, run_dir: str | None,
          not_written: Sequence[Json] = ()) -> Json:
    """The envelope as a JSON-ready dict. ``run_dir``: the run's (or an attempt's own) on the
    node that writes it; ``not_written``: the places that refused an earlier copy."""
    verdict, frame, nodes = outcome.verdict, outcome.frame, outcome.nodes
    ranks = sorted((r for n in nodes for r in n.ranks), key=lambda r: r["rank"])
    restarts = frame.restarts
    return {
        "schema": SCHEMA,
        "tool": {"name": "forgelm-tui", "version": __version__},
        "provisional": frame.provisional,
        "run_id": info.run_id,
        **verdict_dict(verdict),
        "contract": info.contract.value,
        "error": None if frame.error is None else redact_text(frame.error),
        "cancelled": _cancelled(outcome),
        "stop": None if outcome.stop is None else stop_entry(
            outcome.stop, outcome.scheduler, agreed=outcome.merged),
        "hang": hang.name(ranks) if outcome.stop is not None
        and outcome.stop.kind is StopKind.STALL else None,
        "command": redact_argv(info.command),
        "mode": info.mode,
        **_launch(info),
        "settings": frame.settings or settings_entry(info),
        "run_dir": run_dir,
        "job_config": info.job_config,
        "started_at": iso(frame.started_at),
        "ended_at": iso(frame.ended_at),
        "duration_s": frame.duration,
        "cancel_requests": _each(outcome, "cancels"),
        "forwarded_signals": _each(outcome, "forwards"),  # what each node's supervisor got
        "descendants": _each(outcome, "descendants"),  # each node stopped its own ranks' own
        "root_cause_rank": verdict.root_cause_rank,
        "root_cause_node": verdict.lost_node if verdict.lost_node is not None else next(
            (r["node_rank"] for r in ranks if r["rank"] == verdict.root_cause_rank), None),
        "root_cause_gpu": next((s for n in nodes for s in n.gpu_samples
                                if s["rank"] == verdict.root_cause_rank), None),
        "outside_signal": next((n.outside_signal for n in nodes if n.outside_signal), None),
        "storage": storage.section((n.storage for n in nodes), not_written),
        "result": next((n.result for n in nodes if n.result is not None), None),
        "rank_states": rank_states(ranks),
        "ranks": [{**r, **verdict.rank_marks(r["rank"])} for r in ranks],
        "supervisor_error": frame.supervisor_error,
        "requeues": info.requeues,
        **({} if restarts is None else {
            "max_restarts": restarts.max_restarts,
            "restart_count": restarts.restart_count,
            "attempts": [a.as_dict() for a in restarts.attempts],
        }),
        **_agreement(outcome),
    }


def without_attempts(info: RunInfo, verdict: Verdict, *, error: str | None = None,
                     supervisor_error: Json | None = None,
                     not_written: Sequence[Json] = ()) -> Json:
    """The envelope of a run that started no attempt (a pre-launch error, an internal error
    before or around the launch): no ranks, no restarts."""
    frame = RunFrame(error=error, supervisor_error=supervisor_error,
                     restarts=Restarts(max_restarts=info.max_restarts))
    return build(info, RunOutcome(verdict, frame), run_dir=info.run_dir, not_written=not_written)


def _cancelled(outcome: RunOutcome) -> Json | None:
    """The first cancel: of the node where the agreed stop began, else the deciding node's."""
    stop = outcome.stop
    origin = next((n for n in outcome.nodes if stop is not None and n.cancelled
                   and n.node_rank == stop.origin_node), None)
    if origin is not None:
        return origin.cancelled
    return outcome.nodes[0].cancelled if outcome.nodes else None


def _each(outcome: RunOutcome, field: str) -> list[Json]:
    """Every node's entries of one list; on several nodes, each says its node."""
    if not outcome.merged:
        return [entry for n in outcome.nodes for entry in getattr(n, field)]
    return [{**entry, "node_rank": n.node_rank} for n in sorted(
        outcome.nodes, key=lambda n: n.node_rank) for entry in getattr(n, field)]


def _agreement(outcome: RunOutcome) -> Json:
    agreement = outcome.agreement
    if agreement is None:
        return {}
    if not agreement.agreed:
        return {"agreement": agreement.as_dict()}
    by_node = {n.node_rank: n for n in outcome.nodes}
    return {"nodes": [_node(n, by_node.get(n), n in agreement.nodes_lost)
                      for n in range(agreement.nnodes)],
            "agreement": agreement.as_dict()}


def _node(node: int, part: NodeOutcome | None, lost: bool) -> Json:
    if part is None:
        return {"node_rank": node, "state": "lost" if lost else "unknown", "host": None,
                "pid": None, "run_dir": None, "ranks": []}
    return {"node_rank": node, "state": "lost" if lost else "done", "host": part.host,
            "pid": part.pid, "run_dir": part.run_dir, "ranks": [r["rank"] for r in part.ranks]}


def rank_states(ranks: Iterable[Json]) -> dict[str, int]:
    """How many of the envelope's ranks are in each state (``exited``, ``failed``, ...): a
    thousand ranks read at a glance. Counted from the ``ranks`` list, so every node's copy of a
    multi-node envelope, which lists every node's ranks, counts the same."""
    return dict(sorted(collections.Counter(r["state"] for r in ranks).items()))
