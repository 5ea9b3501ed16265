"""The keys, built from the app's own bindings: the help never disagrees with what keys do."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

# Keys the widgets and Textual own, not the app's bindings.
WIDGET_KEYS = (
    ("up / down", "select a rank (mouse works too)"),
    ("ctrl+p", "command palette: every action, forward SIGUSR1 / SIGUSR2"),
)


def actions(bindings: Iterable[Binding]) -> list[tuple[Binding, str]]:
    """Each action once, in the bindings' order: its first binding (the name and what it does)
    and all its keys (``c / ctrl+c``). The help screen and the command palette read this."""
    first: dict[str, Binding] = {}
    keys: dict[str, list[str]] = {}
    for binding in bindings:
        first.setdefault(binding.action, binding)
        keys.setdefault(binding.action, []).append(binding.key_display or binding.key)
    return [(binding, " / ".join(keys[action])) for action, binding in first.items()]


def key_rows(bindings: Iterable[Binding]) -> list[tuple[str, str]]:
    """One row per action: its keys (``c / ctrl+c``) and what it does."""
    rows = [(keys, binding.tooltip or binding.description) for binding, keys in actions(bindings)]
    rows[2:2] = WIDGET_KEYS[:1]  # before the rank and log keys
    rows.append(WIDGET_KEYS[1])
    return rows


def key_grid(rows: list[tuple[str, str]]) -> Table:
    """Keys in one column, what they do in the other: a narrow screen wraps the text under
    its own column, never under the keys."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for keys, text in rows:
        grid.add_row(Text(keys), Text(text))  # Text: no markup
    return grid


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss(None)", "Close")]

    def __init__(self, bindings: Iterable[Binding]) -> None:
        super().__init__()
        self._rows = key_rows(bindings)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):  # the title docked (the .tcss), the keys scroll
            yield Static("forgelm-tui keys", id="help-title")
            yield Static(key_grid(self._rows), id="help-keys")
            yield Static("Lines marked [rank N]! came from stderr.", markup=False)
