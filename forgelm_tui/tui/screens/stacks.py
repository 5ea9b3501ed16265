"""Capture stacks, from the TUI: every live rank's Python stack (all threads) now, written to
the run dir; the run goes on. The same as SIGQUIT to the supervisor (docs/progress.md)."""

from __future__ import annotations

from typing import Any

from textual.app import App

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.sanitize import sanitize_line
from forgelm_tui.engine.stack_text import short_frame
from forgelm_tui.session.ending import RunEnding
from forgelm_tui.tui.handle import RunHandle
from forgelm_tui.tui.model import RunModel


def stacks_notice(event: ev.StacksCaptured) -> str:
    """One notification: where each rank was stuck, and where every thread's stack is."""
    parts = []
    for stacks in event.ranks:
        if stacks.stuck_at:
            parts.append(f"rank {stacks.rank}: {short_frame(sanitize_line(stacks.stuck_at))}")
        else:
            parts.append(f"rank {stacks.rank}: no stacks ({sanitize_line(stacks.note or '')})")
    files = [s.file for s in event.ranks if s.file]
    where = f"\nEvery thread: {sanitize_line(files[0]).rsplit('/', 1)[0]}/rank-N.stacks.txt" \
        if files else ""
    return f"Stacks ({event.seconds:.1f} s):\n" + "\n".join(parts) + where


class StacksActions(App[int]):
    """The SupervisorApp's ``t`` key and palette entry "Capture stacks"."""

    run_handle: RunHandle
    model: RunModel
    ending: RunEnding | None
    _stacks_listening = False

    def action_capture_stacks(self) -> None:
        if self.ending is not None:
            self.notify("The run has ended: the stacks it captured are in the verdict.")
            return
        if not self._stacks_listening:
            self._stacks_listening = True
            self.run_handle.subscribe(self._on_stacks)
        if self.run_handle.request_stacks("operator"):
            self.notify("Capturing every live rank's stacks (at most 2 s); the run goes on.")
        else:
            self.notify("No capture started: one is under way (its result follows), no rank "
                        "is running, or this viewer is read-only.")

    def _on_stacks(self, event: Any) -> None:
        if isinstance(event, ev.StacksCaptured) and event.reason.startswith("requested by"):
            self.notify(stacks_notice(event), timeout=15)
