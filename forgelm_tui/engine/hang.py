"""Which collective a hang waits in, and which ranks never entered it (docs/progress.md,
"Hangs"). Pure functions over collective counts.

Every process group numbers the collectives a rank enters (rank/collectives.py, said at most
once a second). While every rank of a group stands at one number, none of them waits for
another in that group. When they stand at different numbers there is a *gap*: the ranks at the
group's highest number entered a collective the others have not, and it cannot complete until
they do (gloo and NCCL collectives complete only when every rank of the group took part). A gap
is normal for a moment (ranks arrive at different times, counts are read a second apart); one
that lasts is what a hang looks like. The gap decides two things:

- **the stall rule**: while a rank is in a gap, only its steps, heartbeats and completed
  collectives count as its progress, not its output or CPU time (``RankRecord.progress_age``).
  A laggard that prints from a background thread, or loops on ``time.sleep``, no longer keeps
  a run alive while its peers wait for it in a collective it never enters.
- **the hang's name**, when a stall is declared: the group and the collective number the others
  wait in, the ranks that wait in it and the ranks that never entered it (``name``).

On several nodes each heartbeat carries its node's lowest and highest count per group
(``bounds``): a few bytes a group, whatever the ranks; each node merges them with its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from forgelm_tui.engine.records import RankRecord

Bounds = dict[str, tuple[int, int]]  # process group -> (lowest, highest) count of its ranks
Json = dict[str, Any]

MAX_WIRE_GROUPS = 16  # groups a heartbeat carries (a job with more sends its first 16)

# The c10d functions a rank waits in; the innermost public one of distributed_c10d.py names the
# collective (its stack, captured at the stall: the op is not in the counts).
_C10D_FRAME = re.compile(r"distributed_c10d\.py:\d+ (?P<op>[a-z][a-z_]*)$")
_NOT_OPS = frozenset({"wrapper", "is_initialized", "get_rank", "get_world_size"})
_BACKWARD_FRAME = re.compile(r":\d+ (_engine_run_backward|backward)$")


def bounds(records: Iterable[RankRecord]) -> Bounds:
    """The lowest and highest count of each group over the live ranks that said theirs (and
    have not destroyed their groups since: an ending rank's last counts are no gap)."""
    found: dict[str, list[int]] = {}
    for record in records:
        if record.alive and not record.collectives_over:
            for group, count in record.collectives.items():
                found.setdefault(group, []).append(count)
    return {group: (min(counts), max(counts)) for group, counts in found.items()}


def merge(parts: Iterable[Bounds]) -> Bounds:
    merged: Bounds = {}
    for part in parts:
        for group, (low, high) in part.items():
            if group in merged:
                low, high = min(low, merged[group][0]), max(high, merged[group][1])
            merged[group] = (low, high)
    return merged


def to_wire(found: Bounds) -> dict[str, list[int]]:
    return {g: [low, high] for g, (low, high) in list(sorted(found.items()))[:MAX_WIRE_GROUPS]}


def from_wire(data: Any) -> Bounds:
    """A heartbeat's bounds; anything malformed is dropped (a node of another version)."""
    if not isinstance(data, dict):
        return {}
    return {str(g): (int(v[0]), int(v[1])) for g, v in data.items()
            if isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)}


def mark_gaps(records: Iterable[RankRecord], found: Bounds, now: float) -> None:
    """Each live rank in a gap of one of its groups since when (``gap_since``), and whether it
    is behind (below a group's highest count: it never entered a collective others wait in)."""
    for record in records:
        if not record.alive:
            continue
        groups = [] if record.collectives_over else [
            (found[g], count) for g, count in record.collectives.items() if g in found]
        in_gap = any(low < high for (low, high), _ in groups)
        record.behind = any(count < high for (_, high), count in groups)
        if not in_gap:
            record.gap_since = None
        elif record.gap_since is None:
            record.gap_since = now


def name(ranks: Sequence[Json]) -> Json | None:
    """The hang, from the envelope's rank entries of a stalled run (every node's, merged): the
    group with a gap among the stalled ranks, its collective the ranks at the highest count
    wait in, and the ranks below it that never entered it; None when no group has a gap (every
    rank at the same count: the run is stuck outside collectives, or the counts are unknown).

    Of several groups with a gap, the one whose missing ranks wait in no other group (they are
    stuck outside any collective: the cause, not a victim), then the one with the most ranks
    waiting, then the lowest group name."""
    stalled = [r for r in ranks if r.get("stalled") and r.get("collectives")]
    groups = sorted({g for r in stalled for g in r["collectives"]}, key=_group_order)
    gaps = []
    for group in groups:
        counts = {r["rank"]: r["collectives"][group] for r in stalled if group in r["collectives"]}
        high = max(counts.values())
        if min(counts.values()) < high:
            waiting = sorted(rank for rank, c in counts.items() if c == high)
            missing = sorted(rank for rank, c in counts.items() if c < high)
            gaps.append((group, high, waiting, missing))
    if not gaps:
        return _mismatch(stalled, groups)
    waiting_somewhere = {rank for _, _, waiting, _ in gaps for rank in waiting}
    group, seq, waiting, missing = min(gaps, key=lambda gap: (
        bool(set(gap[3]) & waiting_somewhere), -len(gap[2])))
    by_rank = {r["rank"]: r for r in ranks}
    op = next(filter(None, (op_of(by_rank[rank].get("stuck_at")) for rank in waiting)), None)
    files = _trace_files([by_rank[rank] for rank in missing + waiting])
    return {"collective": {"pg": group, "seq": seq, "op": op,
                           "op_from": None if op is None else "stacks"},
            "waiting_ranks": waiting, "missing_ranks": missing, "mismatch": None,
            "other_groups": [g for g, *_ in gaps if g != group],
            "trace_files": list(dict.fromkeys(files))}


def _mismatch(stalled: Sequence[Json], groups: Sequence[str]) -> Json | None:
    """Every rank of a group at the same count, but their stacks in different collectives
    (one rank in a barrier, its peer in an all_reduce: the program called different ones, a
    stop handler's collective against the loop's): a hang no count tells, named from the
    stacks. None when the stacks do not show two different collectives."""
    for group in groups:
        ranks = [r for r in stalled if group in r["collectives"]]
        if len({r["collectives"][group] for r in ranks}) != 1:
            continue
        ops: dict[str, list[int]] = {}
        for rank in sorted(ranks, key=lambda r: r["rank"]):
            op = op_of(rank.get("stuck_at"))
            if op is not None:
                ops.setdefault(op, []).append(rank["rank"])
        if len(ops) >= 2:
            files = _trace_files(ranks)
            return {"collective": {"pg": group, "seq": ranks[0]["collectives"][group],
                                   "op": None, "op_from": "stacks"},
                    "waiting_ranks": sorted(r["rank"] for r in ranks), "missing_ranks": [],
                    "mismatch": ops, "other_groups": [], "trace_files": files}
    return None


def _trace_files(ranks: Sequence[Json]) -> list[str]:
    """The ranks' stacks files, then their NCCL flight-recorder dumps (engine/nccl_dump.py)."""
    return [r[key] for key in ("stacks_file", "nccl_dump_file") for r in ranks if r.get(key)]


def op_of(stuck_at: str | None) -> str | None:
    """The collective a rank waits in, from its main thread's innermost frame: a public
    function of torch's distributed_c10d.py (``all_reduce``, ``barrier``...); a rank waiting in
    autograd's backward waits in DDP's gradient all-reduce."""
    if not stuck_at:
        return None
    found = _C10D_FRAME.search(stuck_at)
    if found is not None and found["op"] not in _NOT_OPS:
        return found["op"]
    if _BACKWARD_FRAME.search(stuck_at):
        return "all_reduce"
    return None


def sentence(hang: Json) -> str:
    """One sentence: ``rank 3 never entered all_reduce #1043 of process group 0; ranks 0-2
    wait in it``."""
    collective = hang["collective"]
    if hang.get("mismatch"):
        called = ", ".join(f"{op} ({rank_list(ranks)})" for op, ranks in hang["mismatch"].items())
        return (f"{rank_list(hang['waiting_ranks'])} wait at collective #{collective['seq']} of "
                f"process group {collective['pg']} in different collectives: {called}")
    what = f"{collective['op'] or 'collective'} #{collective['seq']}"
    missing, waiting = hang["missing_ranks"], hang["waiting_ranks"]
    wait = "waits" if len(waiting) == 1 else "wait"
    return (f"{rank_list(missing)} never entered {what} of process group {collective['pg']}; "
            f"{rank_list(waiting)} {wait} in it")


def rank_list(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-2, 5``."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def _group_order(group: str) -> tuple[int, str]:
    return (int(group), "") if group.isdigit() else (1 << 62, group)
