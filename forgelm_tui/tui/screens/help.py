"""The keys, built from the app's own bindings: the help never disagrees with what keys do."""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

# Keys the widgets and Textual own, not the app's bindings.
WIDGET_KEYS = (
    ("up / down", "select a rank (mouse works too)"),
    ("ctrl+p", "command palette: every action, forward SIGUSR1 / SIGUSR2"),
)


def key_lines(bindings: Iterable[Binding]) -> list[str]:
    """One line per action: its keys (``c / ctrl+c``) and what it does."""
    keys: dict[str, list[str]] = {}
    text: dict[str, str] = {}
    for binding in bindings:
        keys.setdefault(binding.action, []).append(binding.key_display or binding.key)
        text.setdefault(binding.action, binding.tooltip or binding.description)
    rows = [(" / ".join(k), text[action]) for action, k in keys.items()]
    rows[2:2] = WIDGET_KEYS[:1]  # before the rank and log keys
    rows.append(WIDGET_KEYS[1])
    width = max(len(k) for k, _ in rows)
    return [f"  {k.ljust(width)}  {t}" for k, t in rows]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss(None)", "Close")]

    def __init__(self, bindings: Iterable[Binding]) -> None:
        super().__init__()
        self._lines = key_lines(bindings)

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static("forgelm-tui keys", id="help-title")
            yield Static("\n".join(self._lines), id="help-keys", markup=False)
            yield Static("Lines marked [rank N]! came from stderr.", markup=False)
