"""One verdict and one envelope for every node (SPEC §8), as pure functions.

Node 0 gathers every node's final records, decides with SPEC §5 over the global ranks (the root
cause is the origin of the agreed stop record, never a comparison of two machines' clocks) and
builds the envelope every node writes. Only a few fields differ between nodes' copies: they are
documented as node-local (docs/envelope.md) and set by :func:`localize`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from forgelm_tui.cluster.wire import ending_from_wire, stop_from_wire
from forgelm_tui.envelope import storage
from forgelm_tui.envelope.build import rank_states, verdict_dict
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
          stop: dict[str, Any] | None, lost: list[int], nnodes: int, *,
          scheduler: dict[str, Any] | None = None) -> dict[str, Any]:
    """Node 0's envelope made global, built here as one new envelope (none is changed): every
    node's ranks, the agreed stop (``scheduler``: why the scheduler stopped the job, asked when
    the stop began), the verdict and what it says of each rank."""
    ordered = sorted(finals.items())

    def each(field: str) -> list[dict[str, Any]]:  # every node's entries, each with its node
        return [{**item, "node_rank": node} for node, f in ordered
                for item in f["envelope"].get(field, [])]

    origin = finals.get(stop["origin_node"]) if stop else None
    cancelled = (origin["envelope"]["cancelled"] if origin is not None
                 and origin["envelope"].get("cancelled") else base.get("cancelled"))
    causes = [f["envelope"].get("root_cause_gpu") for _, f in ordered]
    outside = [f["envelope"].get("outside_signal") for _, f in ordered]
    ranks = sorted((r for f in finals.values() for r in f["envelope"]["ranks"]),
                   key=lambda r: r["rank"])
    return {
        **base,
        **verdict_dict(verdict),
        "cancelled": cancelled,
        "stop": base.get("stop") if stop is None else _agreed_stop(base.get("stop"), stop,
                                                                    scheduler),
        "cancel_requests": each("cancel_requests"),
        "forwarded_signals": each("forwarded_signals"),  # what each node's supervisor got
        "descendants": each("descendants"),  # each node stopped what its own ranks left
        "root_cause_rank": verdict.root_cause_rank,
        # the root cause's node had it as its own root cause
        "root_cause_gpu": next((c for c in causes if c and c["rank"] == verdict.root_cause_rank),
                               None),
        "outside_signal": next((o for o in outside if o), None),
        "storage": storage.merged(f["envelope"].get("storage") for f in finals.values()),
        # each node marked its own ranks by its own verdict: the agreed one marks them all
        "rank_states": rank_states(ranks),
        "ranks": [{**r, **verdict.rank_marks(r["rank"])} for r in ranks],
        "nodes": [_node_dict(n, finals.get(n), n in lost) for n in range(nnodes)],
        "agreement": {"agreed": True, "decided_by_node": 0, "nodes_lost": lost},
    }


def _agreed_stop(own: dict[str, Any] | None, stop: dict[str, Any],
                 scheduler: dict[str, Any] | None) -> dict[str, Any]:
    """The agreed stop record as this envelope says it; the grace is this node's own stop's
    when it had one: the agreed one's, or more if it grew here (a preemption)."""
    own = own or {}
    agreed = {**own, **_stop_dict(stop), "scheduler": scheduler}
    return {**agreed, "grace_s": own["grace_s"]} if "grace_s" in own else agreed


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
    return {**envelope, **{name: local.get(name) for name in NODE_LOCAL}}
