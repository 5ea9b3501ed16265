"""The envelope's entries, each serialised by one function from its typed record on the node
that holds it (records never leave their node): a rank, a cancel, a forward, a descendant, the
stop, the verdict. envelope/build.py composes them; nothing changes an entry once made.

Every field is documented in docs/envelope.md. No environment values ever go in: they may hold
secrets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from forgelm_tui.engine import nccl_dump
from forgelm_tui.engine.crash import read_error_file
from forgelm_tui.engine.records import (
    CancelRequest,
    DescendantRecord,
    ForwardRequest,
    RankRecord,
    StopRecord,
)
from forgelm_tui.envelope.gpu import rank_gpu
from forgelm_tui.isotime import iso
from forgelm_tui.signames import signal_name
from forgelm_tui.verdict import Verdict

Json = dict[str, Any]
ERROR_TAIL_LINES = 20


def sig_name(sig: int | None) -> str | None:
    return None if sig is None else signal_name(sig)


def verdict_dict(verdict: Verdict) -> Json:
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


def _error_file(path: str) -> Json | None:
    """The root-cause record a ``@record``-decorated rank leaves in its error file."""
    found = read_error_file(path)
    return None if found is None else dataclasses.asdict(found)


def rank_entry(record: RankRecord, result: Json | None) -> Json:
    """``ranks[]`` as the rank's own node writes it; the verdict's marks are added where the
    envelope is composed (envelope/build.py), from the run's verdict."""
    failed = failed_on_own(record)
    duration = None
    if record.started_mono is not None and record.ended_mono is not None:
        duration = round(record.ended_mono - record.started_mono, 3)
    signals = [
        {
            "signal": sig_name(s.signal),
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
        "signal": sig_name(record.signal),
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
        "collectives": dict(record.collectives) or None,
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
        "forgelm_result": result,
    }


def _stacks(record: RankRecord) -> Json:
    """Where the rank was stuck at the last capture of its stacks (docs/progress.md)."""
    stacks = record.stacks
    return {
        "stuck_at": stacks.stuck_at if stacks else None,
        "stacks_file": stacks.file if stacks else None,
        "stacks_via": stacks.via if stacks else None,
        "stacks_note": stacks.note if stacks else None,
        "nccl_dump_file": nccl_dump.dump_file(record.nccl_dump, record.rank, record.started_at),
    }


def cancelled_entry(cancel: CancelRequest, requests: int) -> Json:
    """``cancelled``: the first cancel request, and how many came."""
    return {"by": cancel.origin, "signal": sig_name(cancel.signal), "at": iso(cancel.at),
            "requests": requests, "source": cancel.source.value}


def cancel_entry(cancel: CancelRequest) -> Json:
    """``cancel_requests[]``: one request, and what it did."""
    return {"source": cancel.source.value, "by": cancel.origin, "signal": sig_name(cancel.signal),
            "at": iso(cancel.at), "effect": cancel.effect,
            "sender": None if cancel.sender is None else cancel.sender.as_dict()}


def forward_entry(forward: ForwardRequest) -> Json:
    """``forwarded_signals[]``: a signal passed on to the ranks."""
    return {"signal": sig_name(forward.signal), "source": forward.source.value,
            "by": forward.origin, "at": iso(forward.at), "ranks": list(forward.ranks),
            "held_since": iso(forward.held_since),
            "sender": None if forward.sender is None else forward.sender.as_dict(),
            "sent_by_scheduler": forward.by_scheduler}


def stop_entry(stop: StopRecord, scheduler: Json | None, *, agreed: bool = False) -> Json:
    """``stop``: how the run was stopped; an agreed (multi-node) stop also says where it began."""
    where = {"origin_node": stop.origin_node, "origin_rank": stop.origin_rank,
             "lost_node": stop.lost_node} if agreed else {}
    return {
        "kind": stop.kind.value,
        "reason": stop.reason,
        "origin": stop.origin,
        "at": iso(stop.at),
        "grace_s": stop.grace,
        "grace_from": stop.grace_from,
        "killed_at": iso(stop.killed_at),
        "signal": sig_name(stop.signal),
        "stacks_delay_s": None if stop.stacks_delay is None else round(stop.stacks_delay, 3),
        "scheduler": scheduler,
        **where,
    }


def descendant_entry(record: DescendantRecord) -> Json:
    """A process a rank left outside its process group, and how it ended."""
    return {
        "pid": record.pid,
        "rank": record.rank,
        "command": record.command,
        "found_by": record.found_by,
        "seen_at": iso(record.seen_at),
        "signals": [{"signal": sig_name(sig), "at": iso(at)} for sig, at in record.signals],
        "ended": None if record.ended is None else record.ended.value,
        "ended_at": iso(record.ended_at),
    }


def outside_signal(records: Iterable[RankRecord]) -> Json | None:
    """The rank that first reported a stop signal the supervisor had not sent, if any."""
    outside = [r for r in records if r.foreign_stop and r.reported_mono is not None]
    if not outside:
        return None
    first = min(outside, key=lambda r: (r.reported_mono or 0.0, r.rank))
    return {"rank": first.rank, "signal": first.reported_signal,
            "ranks": sorted(r.rank for r in outside)}


def failed_on_own(record: RankRecord) -> bool:
    """It ended failing on its own (not stopped): its stderr tail and error file are kept."""
    return record.ended_mono is not None and record.ending().failed_on_own
