"""One verdict and one envelope for every node (SPEC §8), as pure functions.

Node 0 gathers every node's final records, decides with SPEC §5 over the global ranks (the root
cause is the origin of the agreed stop record, never a comparison of two machines' clocks) and
builds the envelope every node writes. Only a few fields differ between nodes' copies: they are
documented as node-local (docs/envelope.md) and set by :func:`localize`.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from typing import Any

from forgelm_tui import storage
from forgelm_tui.cluster.wire import ending_from_wire, stop_from_wire
from forgelm_tui.verdict import (
    Contract,
    LostCause,
    StopFacts,
    StopKind,
    Verdict,
    decide,
    lost_first,
    prelaunch_failure,
)

NODE_LOCAL = ("node_rank", "run_dir", "command")


def stop_facts(stop: dict[str, Any] | None,
               first_failure: dict[str, Any] | None = None) -> StopFacts | None:
    """The agreed stop as the verdict needs it. The root-cause candidate is the origin of a
    failure stop, else the first failure any node reported to the store (a cancel may have been
    written first): the store orders them, never two machines' clocks."""
    origin = None if first_failure is None else first_failure["rank"]
    if stop is None:
        return None if origin is None else StopFacts(StopKind.FAILURE, None, origin)
    record = stop_from_wire(stop)
    if record.origin_rank is not None:
        origin = record.origin_rank
    return StopFacts(record.kind, record.signal, origin, record.lost_node)


def decide_global(finals: dict[int, dict[str, Any]], stop: dict[str, Any] | None,
                  contract: Contract, first_failure: dict[str, Any] | None = None, *,
                  rank0_decides: bool = False, lost: LostCause | None = None) -> Verdict:
    """The run's code from every node's rank endings and the agreed stop record.

    Collateral (a failure after rank 0's outcome exit, ForgeLM mode) is judged only for ranks
    on rank 0's node: each ending's ``ended_mono`` is its own machine's clock (verdict.py)."""
    if any(f.get("launch_error") for f in finals.values()):
        return prelaunch_failure()
    endings = [ending_from_wire(e) for f in finals.values() for e in f["endings"]]
    return decide(endings, lost_first(stop_facts(stop, first_failure), lost), contract,
                  rank0_decides=rank0_decides)


def verdict_to_wire(verdict: Verdict) -> dict[str, Any]:
    return asdict(verdict)


def verdict_from_wire(data: dict[str, Any]) -> Verdict:
    values = dict(data)
    values["disagreements"] = tuple(tuple(d) for d in values.get("disagreements", ()))
    for name in ("collateral", "after_rank0_exit"):
        values[name] = tuple(values.get(name) or ())
    if values.get("exception") is not None:
        values["exception"] = tuple(values["exception"])
    return Verdict(**values)


def merge(base: dict[str, Any], finals: dict[int, dict[str, Any]], verdict: Verdict,
          stop: dict[str, Any] | None, lost: list[int], nnodes: int,
          verdict_fields: dict[str, Any]) -> dict[str, Any]:
    """Node 0's envelope made global: every node's ranks, the agreed stop, the verdict."""
    envelope = copy.deepcopy(base)
    envelope.update(verdict_fields)
    ranks = [r for f in finals.values() for r in f["envelope"]["ranks"]]
    envelope["ranks"] = sorted(ranks, key=lambda r: r["rank"])
    envelope["cancel_requests"] = [
        {**c, "node_rank": node} for node, f in sorted(finals.items())
        for c in f["envelope"]["cancel_requests"]]
    envelope["forwarded_signals"] = [  # each node forwards what its own supervisor got
        {**f_, "node_rank": node} for node, f in sorted(finals.items())
        for f_ in f["envelope"].get("forwarded_signals", [])]
    envelope["descendants"] = [  # each node stopped what its own ranks left
        {**d, "node_rank": node} for node, f in sorted(finals.items())
        for d in f["envelope"].get("descendants", [])]
    origin = finals.get(stop["origin_node"]) if stop else None
    if origin is not None and origin["envelope"].get("cancelled"):
        envelope["cancelled"] = origin["envelope"]["cancelled"]
    if stop is not None:
        own = envelope.get("stop") or {}
        envelope["stop"] = {**own, **_stop_dict(stop)}
        if "grace_s" in own:  # the grace this node's stop had: the agreed one's, or more if
            envelope["stop"]["grace_s"] = own["grace_s"]  # it grew here (a preemption)
    envelope["root_cause_rank"] = verdict.deciding_rank if verdict.rule == 2 else None
    causes = [f["envelope"].get("root_cause_gpu") for _, f in sorted(finals.items())]
    envelope["root_cause_gpu"] = next(  # the root cause's node had it as its own root cause
        (c for c in causes if c and c["rank"] == envelope["root_cause_rank"]), None)
    for rank in envelope["ranks"]:  # each node marked its own ranks by its own verdict
        rank["collateral"] = rank["rank"] in verdict.collateral
        rank["failed_after_rank0_exit"] = rank["rank"] in verdict.after_rank0_exit
    envelope["nodes"] = [_node_dict(n, finals.get(n), n in lost) for n in range(nnodes)]
    envelope["agreement"] = {"agreed": True, "decided_by_node": 0, "nodes_lost": lost}
    outside = [f["envelope"].get("outside_signal") for _, f in sorted(finals.items())]
    envelope["outside_signal"] = next((o for o in outside if o), None)
    envelope["storage"] = storage.merged(f["envelope"].get("storage") for f in finals.values())
    return envelope


def _stop_dict(stop: dict[str, Any]) -> dict[str, Any]:
    from forgelm_tui.isotime import iso
    from forgelm_tui.signames import signal_name

    return {"kind": stop["kind"], "reason": stop["reason"], "origin": stop["origin"],
            "at": iso(stop["at"]), "grace_s": stop["grace"],
            "signal": None if stop["signal"] is None else signal_name(stop["signal"]),
            "origin_node": stop["origin_node"], "origin_rank": stop["origin_rank"],
            "lost_node": stop["lost_node"]}


def _node_dict(node: int, final: dict[str, Any] | None, lost: bool) -> dict[str, Any]:
    if final is None:
        return {"node_rank": node, "state": "lost" if lost else "unknown", "host": None,
                "pid": None, "run_dir": None, "ranks": []}
    env = final["envelope"]
    return {"node_rank": node, "state": "lost" if lost else "done", "host": final["host"],
            "pid": final["pid"], "run_dir": env["run_dir"],
            "ranks": [r["rank"] for r in env["ranks"]]}


def localize(envelope: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    """The agreed envelope as this node writes it: the node-local fields are its own."""
    mine = dict(envelope)
    for name in NODE_LOCAL:
        mine[name] = local.get(name)
    return mine
