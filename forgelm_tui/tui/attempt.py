"""A restart in the TUI (``--max-restarts``): the run header shows ``attempt 2/3``, and a new
attempt starts with fresh rank rows (its ranks are new processes); the logs keep every line."""

from __future__ import annotations

from collections.abc import Callable

from forgelm_tui.engine import events as ev
from forgelm_tui.tui.model import RankRow, RunModel
from forgelm_tui.wording.ending import attempt_text


def follow_attempts(model: RunModel) -> Callable[[ev.Event], None]:
    """``model.apply``, and a new attempt's fresh start (what the app subscribes)."""

    def apply(event: ev.Event) -> None:
        if isinstance(event, ev.AttemptStarted):
            start_attempt(model, event)
        model.apply(event)

    return apply


def restore(model: RunModel, snapshot: ev.RunSnapshot) -> None:
    """``model.restore``, with the attempt under way (a viewer attached after a restart)."""
    model.restore(snapshot)
    model.attempt = snapshot.attempt


def start_attempt(model: RunModel, attempt: ev.AttemptStarted) -> None:
    model.attempt = attempt
    if attempt.attempt == 0:
        return
    model.state, model.stop, model.stop_deadline, model.live_ranks = "starting", None, None, ()
    model.ended_at = None
    for rank, row in list(model.ranks.items()):  # every node's ranks start again
        model.ranks[rank] = RankRow(rank, local_rank=row.local_rank, node_rank=row.node_rank)
    model.notices.append(f"{attempt_text(attempt)}: {attempt.reason}")


def attempt_label(attempt: ev.AttemptStarted | None) -> str | None:
    """``attempt 2/3`` (1-based: the second of at most three), or None without restarts."""
    if attempt is None or attempt.max_restarts == 0:
        return None
    return attempt_text(attempt)
