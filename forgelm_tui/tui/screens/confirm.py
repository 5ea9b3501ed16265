"""Yes/no questions: confirm before stopping every rank (and the base of every question)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class Question(ModalScreen[bool]):
    """Returns True for yes (y, or the yes button); "no" has the focus. Texts are plain."""

    BINDINGS = [Binding("n,escape", "dismiss(False)", "No")]

    def __init__(self, title: str, text: str, yes: str, no: str, yes_variant: str) -> None:
        super().__init__()
        self._parts = (title, text, yes, no, yes_variant)

    def compose(self) -> ComposeResult:
        title, text, yes, no, variant = self._parts
        # The question and the buttons are docked (the .tcss): on a small screen the text
        # between them scrolls, and what to press always shows.
        with VerticalScroll(id="confirm-box"):
            yield Static(title, id="confirm-title", markup=False)
            yield Static(text, id="confirm-text", markup=False)
            with Horizontal(id="confirm-buttons"):
                yield Button(yes, variant=variant, id="confirm-yes")  # type: ignore[arg-type]
                yield Button(no, id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def action_confirm(self) -> None:
        self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")


class ConfirmCancel(Question):
    """Confirms the stop (y, or c / ctrl+c pressed again)."""

    BINDINGS = [
        Binding("y,c", "confirm", "Stop the run"),
        Binding("n,escape", "dismiss(False)", "Keep running"),
    ]

    def __init__(self, ranks: int, grace: float) -> None:
        super().__init__(
            "Stop the run?",
            f"Every live rank of {ranks} gets SIGTERM now; whatever is still running after "
            f"{grace:g} s gets SIGKILL. Press c or k again while it stops to kill at once.",
            "Stop run (y)", "Keep running (n)", "error")
