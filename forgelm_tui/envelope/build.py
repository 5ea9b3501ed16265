"""The JSON envelope (SPEC §6): schema, build, atomic write.

Every field is documented in docs/envelope.md. No environment values ever go in: they may hold
secrets.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from forgelm_tui import __version__
from forgelm_tui.engine.crash import read_error_file
from forgelm_tui.engine.records import (
    CancelRequest,
    DescendantRecord,
    ForwardRequest,
    RankRecord,
    StopRecord,
)
from forgelm_tui.envelope.gpu import last_gpu_sample, rank_gpu
from forgelm_tui.envelope.storage import storage_section
from forgelm_tui.isotime import iso
from forgelm_tui.plan.planner import RunInfo
from forgelm_tui.redact import redact_argv, redact_text
from forgelm_tui.signames import signal_name
from forgelm_tui.verdict import Verdict

SCHEMA = "forgelm-tui/envelope/v1"
ERROR_TAIL_LINES = 20


def _sig_name(sig: int | None) -> str | None:
    return None if sig is None else signal_name(sig)


def verdict_dict(verdict: Verdict) -> dict[str, Any]:
    """The envelope's fields that say the code and why (also what node 0 sets on every node's)."""
    return {
        "exit_code": verdict.code,
        "exit_name": verdict.name,
        "exit_meaning": verdict.meaning,
        "ci_action": verdict.ci_action,
        "decided_by": {
            "rule": verdict.rule,
            "explanation": verdict.rule_text,
            "rank": verdict.deciding_rank,
            "node": verdict.lost_node,  # a lost node as the root cause (SPEC §10)
        },
        "disagreements": [{"rank": r, "exit_code": c} for r, c in verdict.disagreements],
        "collateral_ranks": list(verdict.collateral),
        "exception": None if verdict.exception is None else {
            "rank": verdict.deciding_rank, "type": verdict.exception[0],
            "message": verdict.exception[1]},
    }


def _error_file(path: str) -> dict[str, Any] | None:
    """The root-cause record a ``@record``-decorated rank leaves in its error file."""
    found = read_error_file(path)
    return None if found is None else dataclasses.asdict(found)


def rank_dict(
    record: RankRecord, failed: bool, result: dict[str, Any] | None,
    verdict: Verdict | None = None,
) -> dict[str, Any]:
    duration = None
    if record.started_mono is not None and record.ended_mono is not None:
        duration = round(record.ended_mono - record.started_mono, 3)
    signals = [
        {
            "signal": _sig_name(s.signal),
            "at": iso(s.at),
            "reason": s.reason,
            "purpose": s.purpose.value,
        }
        for s in record.signals_sent
    ]
    first_stop = record.first_stop
    return {
        "rank": record.rank,
        "local_rank": record.local_rank,
        "node_rank": record.node_rank,
        "pid": record.pid,
        "state": record.state.value,
        "exit_code": record.exit_code,
        "signal": _sig_name(record.signal),
        "signalled_by_supervisor": record.signalled_first,
        "signalled_at": iso(first_stop.at) if first_stop else None,
        "signalled_reason": first_stop.reason if first_stop else None,
        "signals_sent": signals,
        "started_at": iso(record.started_at),
        "ended_at": iso(record.ended_at),
        "duration_s": duration,
        "stdout_log": record.stdout_log,
        "stderr_log": record.stderr_log,
        "stdout_bytes": record.stdout_bytes,
        "stderr_bytes": record.stderr_bytes,
        "peak_rss_bytes": record.peak_rss_bytes,
        "gpu": rank_gpu(record),
        "stalled": record.stalled,
        "progress_evidence": record.progress_evidence,
        "progress": {
            "step": record.step,
            "total": record.total,
            "metrics": record.metrics,
            "source": record.progress_source,
        }
        if record.progress_source
        else None,
        "metrics_history": record.history.as_dict(),
        **_stacks(record),
        "stopped_at_step": record.stopped_step,
        "reported_signal": record.reported_signal,
        "stopped_from_outside": record.foreign_stop,
        "forwarded_death": record.forwarded_death,
        "killed_from_outside": record.outside_death,
        "stderr_tail": list(record.stderr_tail)[-ERROR_TAIL_LINES:] if failed else None,
        "error": _error_file(record.error_file) if failed else None,
        "exception": None if record.crash is None else {
            "type": record.crash[0], "message": record.crash[1]},
        **(verdict.rank_marks(record.rank) if verdict is not None
           else {"collateral": False, "failed_after_rank0_exit": False}),
        "forgelm_result": result,
    }


def _stacks(record: RankRecord) -> dict[str, Any]:
    """Where the rank was stuck at the last capture of its stacks (docs/progress.md)."""
    stacks = record.stacks
    return {
        "stuck_at": stacks.stuck_at if stacks else None,
        "stacks_file": stacks.file if stacks else None,
        "stacks_via": stacks.via if stacks else None,
        "stacks_note": stacks.note if stacks else None,
    }


@dataclasses.dataclass(frozen=True)
class Restarts:
    """The run beyond the attempt an envelope describes (``--max-restarts``)."""

    max_restarts: int = 0
    restart_count: int = 0
    attempts: tuple[dict[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class RunFrame:
    """The envelope's facts beside the plan (RunInfo) and the ranks: when and where the run (or
    the attempt) ran, its pre-launch error, and what only the end of a run knows: a cancel
    between two attempts, an internal error, the attempts, the nodes' agreement. Given to
    :func:`build` whole: nothing is added to an envelope once it is built."""

    started_at: float | None = None
    ended_at: float | None = None
    run_dir: str | None = None
    error: str | None = None
    cancelled_between: dict[str, Any] | None = None  # when the attempt itself had no cancel
    supervisor_error: dict[str, Any] | None = None
    restarts: Restarts | None = None  # None: an attempt's own envelope (its ``attempts`` entry)
    agreement: dict[str, Any] | None = None  # multi-node, decided without agreement

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return round(self.ended_at - self.started_at, 3)


def _launch(info: RunInfo) -> dict[str, Any]:
    """The launch's facts: the spec's once there is one; before, what the planner knew."""
    spec = info.spec
    if spec is None:
        return {"rank_command": [], "world_size": 0, "nproc_per_node": 0, "nnodes": info.nnodes,
                "node_rank": info.node_rank, "master_addr": None, "master_port": None}
    return {"rank_command": redact_argv(spec.argv), "world_size": spec.world_size,
            "nproc_per_node": spec.nproc_per_node, "nnodes": spec.nnodes,
            "node_rank": spec.node_rank, "master_addr": spec.master_addr,
            "master_port": spec.master_port}


def build_without_attempts(info: RunInfo, verdict: Verdict, error: str | None = None,
                           supervisor_error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The envelope of a run that started no attempt (a pre-launch error, an internal error
    before or around the launch): no ranks, no restarts."""
    return build(info, verdict, frame=RunFrame(
        run_dir=info.run_dir, error=error, supervisor_error=supervisor_error,
        restarts=Restarts(max_restarts=info.max_restarts)))


def build(
    info: RunInfo,
    verdict: Verdict,
    records: Iterable[RankRecord] = (),
    *,
    frame: RunFrame,
    stop: StopRecord | None = None,
    cancels: Sequence[CancelRequest] = (),
    forwards: Sequence[ForwardRequest] = (),
    descendants: Sequence[DescendantRecord] = (),
    results: dict[int, dict[str, Any]] | None = None,
    provisional: bool = False,
) -> dict[str, Any]:
    """The envelope as a JSON-ready dict."""
    results = results or {}
    ranks = sorted(records, key=lambda r: r.rank)
    rank_dicts = [rank_dict(r, _failed(r), results.get(r.rank), verdict) for r in ranks]
    cancel = cancels[0] if cancels else None
    restarts = frame.restarts
    envelope: dict[str, Any] = {
        "schema": SCHEMA,
        "tool": {"name": "forgelm-tui", "version": __version__},
        "provisional": provisional,
        "run_id": info.run_id,
        **verdict_dict(verdict),
        "contract": info.contract.value,
        "error": None if frame.error is None else redact_text(frame.error),
        "cancelled": {
            "by": cancel.origin,
            "signal": _sig_name(cancel.signal),
            "at": iso(cancel.at),
            "requests": len(cancels),
            "source": cancel.source.value,
        }
        if cancel
        else frame.cancelled_between,
        "stop": {
            "kind": stop.kind.value,
            "reason": stop.reason,
            "origin": stop.origin,
            "at": iso(stop.at),
            "grace_s": stop.grace,
            "grace_from": stop.grace_from,
            "killed_at": iso(stop.killed_at),
            "signal": _sig_name(stop.signal),
            "stacks_delay_s": None if stop.stacks_delay is None else round(stop.stacks_delay, 3),
            "scheduler": info.scheduler_stop,
        }
        if stop
        else None,
        "command": redact_argv(info.command),
        "mode": info.mode,
        **_launch(info),
        "settings": {
            "grace_s": info.grace,
            "grace_source": info.grace_source,
            "kill_window_s": info.kill_window,
            "drain_s": info.spec.drain if info.spec else None,
            "stall_timeout_s": info.spec.stall_timeout if info.spec else None,
            "graceful": info.graceful,
        },
        "run_dir": frame.run_dir,
        "job_config": info.job_config,
        "started_at": iso(frame.started_at),
        "ended_at": iso(frame.ended_at),
        "duration_s": frame.duration,
        "cancel_requests": [
            {"source": c.source.value, "by": c.origin, "signal": _sig_name(c.signal),
             "at": iso(c.at), "effect": c.effect,
             "sender": None if c.sender is None else c.sender.as_dict()}
            for c in cancels
        ],
        "forwarded_signals": [
            {"signal": _sig_name(f.signal), "source": f.source.value, "by": f.origin,
             "at": iso(f.at), "ranks": list(f.ranks), "held_since": iso(f.held_since),
             "sender": None if f.sender is None else f.sender.as_dict(),
             "sent_by_scheduler": f.by_scheduler}
            for f in forwards
        ],
        "descendants": [descendant_dict(d) for d in descendants],
        "root_cause_rank": verdict.root_cause_rank,
        "root_cause_gpu": last_gpu_sample(next(
            (r for r in ranks if r.rank == verdict.root_cause_rank), None)),
        "outside_signal": _outside_signal(ranks),
        "storage": storage_section(ranks),
        "result": results.get(0),
        "rank_states": rank_states(rank_dicts),
        "ranks": rank_dicts,
        "supervisor_error": frame.supervisor_error,
        **({} if restarts is None else {
            "max_restarts": restarts.max_restarts,
            "restart_count": restarts.restart_count,
            "attempts": list(restarts.attempts),
        }),
        **({} if frame.agreement is None else {"agreement": frame.agreement}),
    }
    return envelope


def rank_states(ranks: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many of the envelope's ranks are in each state (``exited``, ``failed``, ...): a
    thousand ranks read at a glance. Counted from the ``ranks`` list, so every node's copy of a
    multi-node envelope, which lists every node's ranks, counts the same."""
    return dict(sorted(collections.Counter(r["state"] for r in ranks).items()))


def descendant_dict(record: DescendantRecord) -> dict[str, Any]:
    """A process a rank left outside its process group, and how it ended."""
    return {
        "pid": record.pid,
        "rank": record.rank,
        "command": record.command,
        "found_by": record.found_by,
        "seen_at": iso(record.seen_at),
        "signals": [{"signal": _sig_name(sig), "at": iso(at)} for sig, at in record.signals],
        "ended": None if record.ended is None else record.ended.value,
        "ended_at": iso(record.ended_at),
    }


def _outside_signal(records: Sequence[RankRecord]) -> dict[str, Any] | None:
    """The rank that first reported a stop signal the supervisor had not sent, if any."""
    outside = [r for r in records if r.foreign_stop and r.reported_mono is not None]
    if not outside:
        return None
    first = min(outside, key=lambda r: (r.reported_mono or 0.0, r.rank))
    return {"rank": first.rank, "signal": first.reported_signal,
            "ranks": sorted(r.rank for r in outside)}


def _failed(record: RankRecord) -> bool:
    return record.ended_mono is not None and record.ending().failed_on_own
