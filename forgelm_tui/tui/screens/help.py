"""The keys, in one place."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = """\
  c / ctrl+c   cancel the run (asks first); again while stopping: kill now
  k            kill every live rank now (SIGKILL)
  up / down    select a rank (mouse works too)
  enter        show the selected rank's log / back to all ranks
  a            show every rank's log, merged
  f            follow the log on / off (scrolling up pauses it, End resumes it)
  /            search the log;  n / N  next / previous match
  s            save the envelope (after the run)
  q            quit (after the run; during it, asks to cancel first)
  ctrl+p       command palette: every action, forward SIGUSR1 / SIGUSR2
  ?            this help
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss(None)", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static("forgelm-tui keys", id="help-title")
            yield Static(KEYS, id="help-keys", markup=False)
            yield Static("Lines marked [rank N]! came from stderr.", markup=False)
