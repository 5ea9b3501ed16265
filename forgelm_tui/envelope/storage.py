"""What a full or unwritable run dir did not keep: the envelope's ``storage`` field and the one
line that says so (docs/envelope.md, docs/security.md). Pure: records and dicts in, data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from forgelm_tui.isotime import iso

if TYPE_CHECKING:
    from forgelm_tui.engine.records import RankRecord


def storage_section(records: Iterable[RankRecord]) -> dict[str, Any] | None:
    """One node's ``storage``: None while every log kept every byte, else what was lost, rank
    by rank (:func:`section` makes the envelope's from every node's)."""
    losses = sorted((loss for r in records for loss in r.log_losses),
                    key=lambda loss: (loss.since, loss.rank, loss.stream))
    if not losses:
        return None
    first = losses[0]
    return {
        "error": first.error,
        "since": iso(first.since),
        "ranks": [
            {"rank": loss.rank, "stream": loss.stream, "path": loss.path,
             "bytes_lost": loss.bytes_lost, "since": iso(loss.since), "error": loss.error,
             "failures": loss.failures, "resumed_at": iso(loss.resumed_at)}
            for loss in sorted(losses, key=lambda loss: (loss.rank, loss.stream))
        ],
        "envelope_not_written": [],
    }


def section(sections: Iterable[dict[str, Any] | None],
            not_written: Sequence[dict[str, str]] = ()) -> dict[str, Any] | None:
    """``storage`` for the envelope: every node's section as one (the earliest failure, every
    rank's loss), and the places that refused an earlier copy of the envelope, if any did."""
    present = [s for s in sections if s and s.get("ranks")]
    if not present and not not_written:
        return None
    if not present:
        return {"error": not_written[0]["error"], "since": None, "ranks": [],
                "envelope_not_written": list(not_written)}
    first = min(present, key=lambda s: s["since"] or "~")
    ranks = sorted((r for s in present for r in s["ranks"]),
                   key=lambda r: (r["rank"], r["stream"]))
    return {"error": first["error"], "since": first["since"], "ranks": ranks,
            "envelope_not_written": list(not_written)}


def not_kept_line(envelope: dict[str, Any]) -> str | None:
    """One line naming what the rank logs did not keep, or None when they kept everything."""
    storage = envelope.get("storage")
    if not storage or not storage.get("ranks"):
        return None
    parts = []
    for entry in storage["ranks"]:
        since = entry["since"] or "?"
        parts.append(f"rank {entry['rank']} {entry['stream']} {_size(entry['bytes_lost'])} "
                     f"from {since[11:23] + 'Z' if len(since) > 20 else since}")
    return f"not kept on disk ({storage['error']}): " + "; ".join(parts)


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    if count < 1 << 20:
        return f"{count / 1024:.1f} KiB ({count} bytes)"
    return f"{count / (1 << 20):.1f} MiB ({count} bytes)"
