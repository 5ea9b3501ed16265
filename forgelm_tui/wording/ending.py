"""How a run ended, in the words both views print before their summary: an error of
forgelm-tui itself, the attempts of a restarted run, the descendants it stopped, a log that
could not be written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from forgelm_tui.engine import events as ev
from forgelm_tui.engine import hang
from forgelm_tui.engine.logfile import RETRY_EVERY


def ending_notes(envelope: dict[str, Any]) -> list[str]:
    """Before the summary: an error of forgelm-tui itself, the hang a stall found, and the
    attempts of a restarted run."""
    notes = []
    if envelope.get("hang"):
        notes.append(f"hang: {hang.sentence(envelope['hang'])}")
    error = envelope.get("supervisor_error")
    if error:
        notes.append(f"forgelm-tui failed: {error['type']}: {error['message']} (in "
                     f"{error['where']}); the envelope has its traceback")
    attempts = envelope.get("attempts") or []
    if attempts and (envelope.get("max_restarts") or len(attempts) > 1):
        last = attempts[-1]["restart"] or {}
        number = attempts[-1].get("attempt", len(attempts) - 1) + 1  # one more: a node joined
        most = max(envelope.get("max_restarts", 0) + 1, number)
        notes.append(f"attempt {number}/{most} was the last: {last.get('why', '-')}; each "
                     "restart's logs in attempt-K/ of the run dir")
    return notes + descendant_lines(envelope.get("descendants", []))


def log_not_kept_text(event: ev.LogNotKept) -> str:
    """The first log write that failed: said once, live; the summary says what was lost."""
    return (f"storage: cannot write rank {event.rank}'s {event.stream.value} log "
            f"{event.path} ({event.error}); rank output is still shown but may miss the disk "
            f"from now on (tried again every {RETRY_EVERY:g} s); the run goes on")


_DESCENDANT_ENDED = {"sigterm": "stopped with SIGTERM", "sigkill": "killed with SIGKILL",
                     "gone": "gone", None: "still running after SIGKILL"}


def descendant_lines(descendants: Sequence[dict[str, Any]]) -> list[str]:
    """One line per process a rank left outside its group that the supervisor stopped (one
    that exited on its own is only in the envelope)."""
    lines = []
    for d in descendants:
        if d["ended"] == "exited":
            continue
        whose = "a rank's" if d["rank"] is None else f"rank {d['rank']}'s"
        name = d["command"].split(" ", 1)[0] or "?"
        how = _DESCENDANT_ENDED.get(d["ended"], d["ended"])
        lines.append(f"{whose} descendant pid {d['pid']} ({name}) {how}")
    return lines


def attempt_text(attempt: ev.AttemptStarted) -> str:
    """``attempt 2/3`` (1-based: the second of at most three); ``attempt 2/3, 2 nodes`` on
    several nodes."""
    nodes = f", {attempt.nnodes} nodes" if attempt.nnodes > 1 else ""
    return f"attempt {attempt.attempt + 1}/{attempt.max_restarts + 1}{nodes}"
