"""The one way forgelm-tui writes a moment: UTC, ISO 8601, milliseconds, ``Z`` (the envelope,
its GPU and storage fields, stack captures)."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def iso(ts: float | None) -> str | None:
    """An epoch time as ``2026-12-03T10:15:46.284Z``; None stays None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def now_iso() -> str:
    return iso(time.time()) or ""
