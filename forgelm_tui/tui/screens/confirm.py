"""Confirm before stopping every rank."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmCancel(ModalScreen[bool]):
    """Returns True when the operator confirms the stop (y, or c / ctrl+c pressed again)."""

    BINDINGS = [
        Binding("y,c", "confirm", "Stop the run"),
        Binding("n,escape", "dismiss(False)", "Keep running"),
    ]

    def __init__(self, ranks: int, grace: float) -> None:
        super().__init__()
        self._ranks = ranks
        self._grace = grace

    def compose(self) -> ComposeResult:
        # The question and the buttons are docked (the .tcss): on a small screen the text
        # between them scrolls, and what to press always shows.
        with VerticalScroll(id="confirm-box"):
            yield Static("Stop the run?", id="confirm-title")
            yield Static(
                f"Every live rank of {self._ranks} gets SIGTERM now; whatever is still "
                f"running after {self._grace:g} s gets SIGKILL. Press c or k again while it "
                "stops to kill at once.",
                id="confirm-text",
            )
            with Horizontal(id="confirm-buttons"):
                yield Button("Stop run (y)", variant="error", id="confirm-yes")
                yield Button("Keep running (n)", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def action_confirm(self) -> None:
        self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")
