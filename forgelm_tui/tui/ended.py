"""The view of a run that has ended, for attach and serve: its verdict in one line (a
terminal), or its verdict and the envelope as a download (a browser tab, textual-serve)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from forgelm_tui.control.find import KnownRun


def deliver_envelope(app: App[Any], path: Path, run_id: str) -> str:
    """The envelope file's exact bytes as a browser download (textual-serve's deliver)."""
    filename = f"forgelm-tui-envelope-{run_id}.json"
    app.deliver_binary(io.BytesIO(path.read_bytes()), save_filename=filename,
                       mime_type="application/json")
    app.notify(f"Envelope sent to the browser as a download: {filename}")
    return filename


class EndedApp(App[int]):
    """A browser tab opened on a run that has ended: its verdict, and `s` for its envelope."""

    CSS = "Static { padding: 1 2; }"
    BINDINGS = [
        Binding("s", "save_envelope", "Download the envelope"),
        Binding("q", "quit_run", "Quit"),
    ]

    def __init__(self, run_id: str, verdict: str, envelope: Path, code: int) -> None:
        super().__init__()
        self.run_id, self.verdict, self.envelope, self.code = run_id, verdict, envelope, code

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(("forgelm-tui", "bold"), "  ", ("FINISHED", "bold"),
                                   f"  ·  run {self.run_id}\n\n{self.verdict}\n\n"
                                   f"envelope: {self.envelope}\n\n",
                                   ("s", "bold"), " download the envelope  ",
                                   ("q", "bold"), " quit"))

    def action_save_envelope(self) -> None:
        deliver_envelope(self, self.envelope, self.run_id)

    def action_quit_run(self) -> None:
        self.exit(self.code)


def show_ended(run: KnownRun, via: str, say: Callable[[str], None]) -> int:
    """A run that has ended: its verdict in one line and its code (in a browser tab: the
    verdict and the envelope's download); 1 when it left no envelope."""
    envelope = run.envelope()
    if envelope is None:
        say(f"forgelm-tui attach: {run.run_id}: the run is gone and left no envelope")
        return 1
    verdict = (f"exit {envelope['exit_code']} {envelope['exit_name']} "
               f"({envelope['decided_by']['explanation']})")
    path, ended = run.run_dir / "envelope.json", int(envelope["exit_code"])
    if via == "browser":  # a tab opened after the end: the verdict and the download
        return EndedApp(run.run_id, verdict, path, ended).run() or ended
    say(f"forgelm-tui: run {run.run_id} has ended: {verdict}; envelope: {path}")
    return ended
