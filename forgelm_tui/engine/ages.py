"""How long since a rank last did something: one definition of each age, read by the engine
(on the monotonic clock, from its records) and by the views (on the wall clock, from events and
snapshots)."""

from __future__ import annotations


def output_age(now: float, last_output: float | None, started: float | None,
               ended: float | None = None) -> float | None:
    """Seconds since the rank last printed anything (since its start if it never did); None
    before it started and once it ended."""
    if ended is not None:
        return None
    since = last_output if last_output is not None else started
    return None if since is None else max(0.0, now - since)


def progress_age(now: float, last_progress: float | None) -> float:
    """Seconds since the rank last showed progress (its start counts: RankRecord.saw)."""
    return 0.0 if last_progress is None else max(0.0, now - last_progress)
