"""Confirm before forwarding a signal that would end ranks without a handler for it."""

from __future__ import annotations

from collections.abc import Sequence

from textual.binding import Binding

from forgelm_tui.tui.screens.confirm import Question


def _ranks(ranks: Sequence[int]) -> str:
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {', '.join(map(str, ranks))}"


def warning_text(signame: str, dying: Sequence[int], unknown: Sequence[int]) -> str:
    parts = []
    if dying:
        verb = "has" if len(dying) == 1 else "have"
        parts.append(f"{_ranks(dying).capitalize()} {verb} no handler for {signame}: its default "
                     "action ends them, and then every other rank is stopped (the run is "
                     "interrupted, exit 2).")
    if unknown:
        parts.append(f"Not known yet for {_ranks(unknown)} (no sample so far).")
    return " ".join(parts)


class ConfirmForward(Question):
    """Returns True when the operator forwards the signal anyway."""

    BINDINGS = [
        Binding("y", "confirm", "Forward"),
        Binding("n,escape", "dismiss(False)", "Do not forward"),
        Binding("c", "app.cancel", "Cancel the run instead"),
    ]

    def __init__(self, signame: str, dying: Sequence[int], unknown: Sequence[int]) -> None:
        super().__init__(f"Forward {signame} to every rank?",
                         warning_text(signame, dying, unknown), "Forward (y)", "Don't (n)",
                         "warning")
        self.signame = signame
