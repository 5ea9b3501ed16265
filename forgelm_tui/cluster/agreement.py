"""One verdict and one envelope for every node (SPEC §8), as pure functions.

Node 0 gathers every node's final records, decides with SPEC §5 over the global ranks (the root
cause is the origin of the agreed stop record, never a comparison of two machines' clocks) and
merges every node's typed outcome into the run's (session/outcome.py), which every node
serialises with its own node-local fields (docs/envelope.md).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from forgelm_tui.cluster.wire import ending_from_wire, stop_from_wire
from forgelm_tui.engine.records import StopRecord
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


def agreed_stop(own: StopRecord | None, stop: dict[str, Any]) -> StopRecord:
    """The agreed stop record as node 0's envelope says it (every node writes the same): what
    the stop key says, with what only node 0's own stop knows (its SIGKILL pass, a stall's wait
    for stacks, a grace grown here: a preemption)."""
    agreed = stop_from_wire(stop)
    if own is None:
        return agreed
    return replace(agreed, grace=own.grace, grace_from=own.grace_from, killed_at=own.killed_at,
                   stacks_delay=own.stacks_delay)
