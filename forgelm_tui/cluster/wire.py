"""What nodes tell each other, as JSON: stop records, rank endings, rank snapshots."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from forgelm_tui.engine.policy import stall_reason
from forgelm_tui.engine.records import StopRecord
from forgelm_tui.verdict import RankEnding, StopKind


def stop_to_wire(stop: StopRecord) -> dict[str, Any]:
    return {"kind": stop.kind.value, "reason": stop.reason, "origin": stop.origin,
            "signal": stop.signal, "at": stop.at, "grace": stop.grace,
            "origin_rank": stop.origin_rank, "origin_node": stop.origin_node,
            "lost_node": stop.lost_node, "source": stop.source}


def stall_to_wire(seconds: float, grace: float, node: int) -> dict[str, Any]:
    """A stall declared on ``node``, told to every node before its stacks are captured: each
    node captures its ranks' stacks at once, before any rank is signalled anywhere (a rank
    gone ends its peers' collective: their stacks would show the aftermath, not the hang)."""
    return stop_to_wire(StopRecord(StopKind.STALL, stall_reason(seconds), "stall", None,
                                   time.time(), 0.0, grace=grace, origin_node=node))


def stop_from_wire(data: dict[str, Any]) -> StopRecord:
    """Another node's stop; its deadline is set when this node applies it (never compared)."""
    return StopRecord(StopKind(data["kind"]), data["reason"], data["origin"], data["signal"],
                      data["at"], 0.0, grace=data["grace"], origin_rank=data["origin_rank"],
                      origin_node=data["origin_node"], lost_node=data["lost_node"],
                      source=data["source"])


def ending_to_wire(ending: RankEnding) -> dict[str, Any]:
    data = asdict(ending)
    for name in ("ended_mono", "foreign_mono"):  # inf is not JSON
        if data[name] == float("inf"):
            data[name] = None
    return data


def ending_from_wire(data: dict[str, Any]) -> RankEnding:
    values = dict(data)
    for name in ("ended_mono", "foreign_mono"):
        if values[name] is None:
            values[name] = float("inf")
    if values.get("crash") is not None:
        values["crash"] = tuple(values["crash"])  # JSON made it a list
    return RankEnding(**values)


def remote_stop(data: dict[str, Any]) -> StopRecord:
    """Another node's stop record as this node applies it: its reason says where it began."""
    stop = stop_from_wire(data)
    stop.reason = f"{stop.reason} (on node {stop.origin_node})"
    return stop


def others_stop(message: dict[str, Any], me: int) -> StopRecord | None:
    """A stop message's record when another node's and well formed (the loop, which reads
    the message too, says what is wrong with one that is not)."""
    data = message.get("stop")
    if not isinstance(data, dict) or data.get("origin_node") == me:
        return None
    try:
        return remote_stop(data)
    except (KeyError, TypeError, ValueError):
        return None
