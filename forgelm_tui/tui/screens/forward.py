"""Confirm before forwarding a signal that would end ranks without a handler for it."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


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


class ConfirmForward(ModalScreen[bool]):
    """Returns True when the operator forwards the signal anyway."""

    BINDINGS = [
        Binding("y", "confirm", "Forward"),
        Binding("n,escape", "dismiss(False)", "Do not forward"),
        Binding("c", "app.cancel", "Cancel the run instead"),
    ]

    def __init__(self, signame: str, dying: Sequence[int], unknown: Sequence[int]) -> None:
        super().__init__()
        self.signame = signame
        self._text = warning_text(signame, dying, unknown)

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(f"Forward {self.signame} to every rank?", id="confirm-title",
                         markup=False)
            yield Static(self._text, id="confirm-text", markup=False)
            with Horizontal(id="confirm-buttons"):
                yield Button("Forward (y)", variant="warning", id="confirm-yes")
                yield Button("Don't (n)", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def action_confirm(self) -> None:
        self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")
