"""The operator's TUI: live per-rank status, coordinated cancel, the verdict, the envelope.

The app decides nothing about processes: it renders what the session tells it and calls
``request_cancel``, ``kill_now`` and ``forward``.
"""

from __future__ import annotations

import functools
import io
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Static

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.node_summary import EVERY_RANK, Watch
from forgelm_tui.engine.records import CancelSource
from forgelm_tui.session.ending import RunEnding
from forgelm_tui.signames import signal_name, signal_number
from forgelm_tui.tui.attempt import follow_attempts
from forgelm_tui.tui.handle import RunHandle
from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.screens.confirm import ConfirmCancel, Question
from forgelm_tui.tui.screens.forward import ConfirmForward
from forgelm_tui.tui.screens.help import HelpScreen, actions
from forgelm_tui.tui.screens.search import SearchPrompt
from forgelm_tui.tui.screens.stacks import StacksActions
from forgelm_tui.tui.terminal import TERMINAL_CLOSED, Terminal, exit_on_signals
from forgelm_tui.tui.widgets.curves import CurvePanel
from forgelm_tui.tui.widgets.key_hints import KeyHints
from forgelm_tui.tui.widgets.log_pane import LogPane
from forgelm_tui.tui.widgets.rank_table import RankTable
from forgelm_tui.tui.widgets.run_header import RunHeader
from forgelm_tui.tui.widgets.verdict_panel import VerdictPanel

TABLE_HZ = 1  # the rank table and header: about once a second (a 64-row repaint costs)
LOG_HZ = 10
LIFECYCLE = (ev.RankStarted, ev.RankSignalled, ev.RankExited, ev.RunStopping)
# What the palette offers beside the bindings' actions (SupervisorApp.get_system_commands):
# the commands no key has (title, what it does, the action).
PALETTE_ONLY = (
    ("Forward SIGUSR1", "to every rank, nothing stops", "forward('SIGUSR1')"),
    ("Forward SIGUSR2", "to every rank, nothing stops", "forward('SIGUSR2')"),
)


class SupervisorApp(StacksActions):
    """Built by :func:`build_app`; tests build it the same way with a scripted run."""

    CSS_PATH = "forgelm_tui.tcss"
    TITLE = "forgelm-tui"
    VERTICAL_BREAKPOINTS = [(0, "-tiny"), (16, "-short"), (30, "-tall")]  # screen classes: tcss
    BINDINGS = [
        Binding("c", "cancel", "Cancel",
                tooltip="cancel the run (asks first); again while stopping: kill now"),
        Binding("ctrl+c", "cancel", "Cancel", show=False, priority=True,
                tooltip="the same as c"),
        Binding("k", "kill", "Kill now", tooltip="kill every live rank now (SIGKILL)"),
        Binding("enter", "toggle_rank_log", "Rank log",
                tooltip="the selected rank's log / all ranks; a node's row: open, close"),
        Binding("a", "all_logs", "All logs", tooltip="show every rank's log, merged"),
        Binding("f", "follow", "Follow",
                tooltip="follow the log on / off (scrolling up pauses it, End resumes it)"),
        Binding("slash", "search", "Search", key_display="/", tooltip="search the log"),
        Binding("n", "search_next", "Next", show=False, tooltip="next match"),
        Binding("N", "search_previous", "Previous", show=False, tooltip="previous match"),
        Binding("s", "save_envelope", "Save envelope", tooltip="save the envelope (after the run)"),
        Binding("t", "capture_stacks", "Capture stacks", show=False,
                tooltip="capture every rank's Python stack now (where each is stuck)"),
        Binding("question_mark", "help", "Help", key_display="?", tooltip="this help"),
        Binding("q", "quit_run", "Quit",
                tooltip="quit (after the run; during it, asks to cancel first)"),
    ]

    def __init__(
        self,
        run: RunHandle,
        *,
        clock: Callable[[], float] = time.time,
        save_directory: Path | None = None,
        auto_start: bool = True,
        terminal_fd: int | None = None,
        before_hard_exit: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.run_handle = run
        self.model = RunModel(run.run_id, run.command, run.world_size, clock)
        self.ending: RunEnding | None = None
        self.save_directory = save_directory
        self.auto_start = auto_start
        self.saved_to: str | None = None
        self.terminal = Terminal(terminal_fd, before_hard_exit)
        self._table_due = False
        self._watch = EVERY_RANK  # what it shows of other nodes (watching)
        self._log_title_extra = ""
        run.subscribe(follow_attempts(self.model))
        run.subscribe(self._on_lifecycle)

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with Vertical(id="body"):
            yield RankTable(id="ranks")
            yield CurvePanel(self.model, id="curves")  # its own 1 Hz timer, hidden when short
            yield VerdictPanel(id="verdict")
            yield Static("", id="log-title")
            yield LogPane(id="logs")
        yield KeyHints(self.BINDINGS, id="keys")

    def on_mount(self) -> None:
        self.set_interval(1 / TABLE_HZ, self.refresh_table)
        self.set_interval(1 / LOG_HZ, self.flush_logs)
        if self.terminal.fd is not None:
            self.set_interval(1.0, self._check_terminal)
        self.refresh_table()
        self._update_log_title()
        self.query_one(RankTable).focus()
        if self.auto_start:
            self.run_worker(self._run(), exclusive=True, name="run")

    async def _run(self) -> None:
        ending = await self.run_handle.run()
        self.show_ending(ending)
        if self.terminal.gone():
            self.terminal.hard_exit(ending.verdict.code)
        if self.run_handle.cancelled_by_signal() or self.terminal.lost:
            # A scheduler asked the run to stop, or the terminal is gone: nobody is at the
            # keyboard to read the verdict.
            self.exit(ending.verdict.code)
            return
        exit_on_signals(self.exit, self.terminal, ending.verdict.code)

    def _check_terminal(self) -> None:
        """A closed terminal is a hang-up, even when no SIGHUP arrives (or it was ignored)."""
        if self.terminal.lost or not self.terminal.gone():
            return
        self.terminal.stop_drawing(self._driver)
        if self.ending is not None:
            self.terminal.hard_exit(self.ending.verdict.code)
        else:  # the same cause as the SIGHUP that usually came first: merged, never a kill
            self.run_handle.request_cancel(TERMINAL_CLOSED, signal.SIGHUP,
                                           source=CancelSource.TERMINAL)

    def panic(self, *renderables: RenderableType) -> None:
        """Textual's input thread fails on a hung-up terminal (EIO) and asks the app to panic:
        that is the terminal closing, not a crash. The run stops gracefully, and the app
        quits once it has (no path ends the app before the envelope is written)."""
        if self.terminal.fd is not None and self.terminal.gone():
            self._check_terminal()
            return
        super().panic(*renderables)

    def hangup_origin(self) -> tuple[CancelSource, str] | None:
        """For the engine's SIGHUP handler: was it the terminal closing? (Then say so.)"""
        if not self.terminal.gone():
            return None
        self.terminal.stop_drawing(self._driver)
        return CancelSource.TERMINAL, TERMINAL_CLOSED

    def show_ending(self, ending: RunEnding) -> None:
        self.ending = ending
        self._close_question("The run has ended.")
        self.model.finished(ending.envelope)
        self.flush_logs()
        self.refresh_table()
        self.query_one(VerdictPanel).show_verdict(
            ending.envelope, ", ".join(ending.envelope_paths) or ending.envelope_path)
        pane = self.query_one(LogPane)
        if pane.auto_scroll:  # the verdict panel took room: the newest line back in view
            self.call_after_refresh(pane.set_follow, True)

    # ------------------------------------------------------------------ refresh

    def _on_lifecycle(self, event: ev.Event) -> None:
        """A rank starting, being signalled or ending shows at once (one repaint per burst of
        such events); samples and output wait for the table's own tick."""
        if isinstance(event, ev.RunStopping) and self.is_running:
            self._close_question(f"Stopping: {event.reason}.")
        if isinstance(event, LIFECYCLE) and not self._table_due and self.is_running:
            self._table_due = True
            self.call_later(self.refresh_table)

    def watching(self) -> Watch:
        """What it shows of other nodes (cluster/views.py), as its table last refreshed."""
        return self._watch

    def refresh_table(self) -> None:
        self._table_due = False
        try:
            header, table = self.query_one(RunHeader), self.query_one(RankTable)
            keys = self.query_one(KeyHints)
        except NoMatches:  # a timer tick while the app is being torn down
            return
        header.render_for(self.model, self.ending.verdict.label if self.ending else None)
        table.refresh_from(self.model)
        self._watch = table.watching()
        phase = "ended" if self.ending else "stopping" if self.model.stop else "running"
        keys.show_phase(phase, self.ending.verdict.code if self.ending else None)

    def flush_logs(self) -> None:
        try:
            pane = self.query_one(LogPane)
        except NoMatches:  # a timer tick while the app is being torn down
            return
        lines, skipped = self.model.logs.take_pending()
        if lines or skipped:
            pane.append(lines, skipped)

    def _update_log_title(self, extra: str = "") -> None:
        self._log_title_extra = extra
        pane = self.query_one(LogPane)
        which = "all ranks" if pane.rank is None else f"rank {pane.rank}"
        follow = "following" if pane.auto_scroll else "paused (f to follow)"
        self.query_one("#log-title", Static).update(
            Text(f" log: {which} · {follow} {extra}", style="bold"))

    # ------------------------------------------------------------------ actions

    def action_cancel(self) -> None:
        """c / ctrl+c: ask, confirm an open question, or (while stopping) kill now."""
        if self.ending is not None:
            self.notify("The run has ended; q quits.")
            return
        if isinstance(self.screen, ConfirmCancel):
            self.screen.action_confirm()  # pressed again with the question open: yes
            return
        if isinstance(self.screen, ConfirmForward):
            self.screen.dismiss(False)  # one question at a time: the stop is the one that counts
        if self.model.stop is not None:
            self.run_handle.kill_now("operator (second cancel)")
            self.notify("Killing every live rank now.", severity="warning")
            return
        self.push_screen(ConfirmCancel(self.run_handle.world_size, self.run_handle.grace),
                         self._confirmed)

    def _confirmed(self, confirmed: bool | None) -> None:
        """A stale answer (the stop began elsewhere, or the run ended) never escalates."""
        if not confirmed or self.ending is not None:
            return
        if self.model.stop is not None:
            self.notify(f"Already stopping: {self.model.stop_reason}.")
            return
        self.run_handle.request_cancel("operator", signal.SIGINT)
        self.notify("Stopping every rank: SIGTERM sent.", severity="warning")

    def _close_question(self, why: str) -> None:
        """The state changed under an open question: it no longer tells the truth."""
        for screen in list(self.screen_stack):
            if isinstance(screen, Question):
                screen.dismiss(None)
                self.notify(why)

    def action_kill(self) -> None:
        if self.ending is None:
            self.run_handle.kill_now("operator")
            self.notify("SIGKILL sent to every live rank.", severity="error")

    def action_forward(self, signame: str) -> None:
        """Forward a signal; first warn which ranks it would end (no handler for it)."""
        sig = signal_number(signame)
        if self.ending is not None or sig is None or isinstance(self.screen, ModalScreen):
            return
        live = [r for r in self.model.ranks.values() if r.pid is not None and not r.ended]
        dying = [r.rank for r in live if r.would_die_of(sig)]
        unknown = [r.rank for r in live if r.would_die_of(sig) is None]
        if not dying and not unknown:
            self._forward(sig, True)
            return
        self.push_screen(ConfirmForward(signame, dying, unknown),
                         lambda yes: self._forward(sig, yes))

    def _forward(self, sig: int, confirmed: bool | None) -> None:
        if confirmed and self.ending is None:
            self.run_handle.forward(sig)
            self.notify(f"{signal_name(sig)} forwarded to every live rank.")

    def on_log_pane_follow_changed(self, event: LogPane.FollowChanged) -> None:
        self._update_log_title(self._log_title_extra)

    def _show_log(self, rank: int | None) -> None:
        """Rebuild the pane for every rank or one. The history already holds the lines still
        waiting for the next flush: they are dropped from the queue, or they would show twice."""
        self.model.logs.take_pending()
        self.query_one(LogPane).show(self.model.logs, rank)
        self._update_log_title()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        pane, key = self.query_one(LogPane), event.row_key.value
        if pane.rank is not None and key is not None and key.isdigit():  # not a node's row
            self._show_log(int(key))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter (or a click on the selected row) switches between this rank and all ranks."""
        self.action_toggle_rank_log()

    def action_toggle_rank_log(self) -> None:
        """On a rank's row: its log or every rank's; on a node's row: open or close it."""
        pane, table = self.query_one(LogPane), self.query_one(RankTable)
        node = table.selected_node()
        if node is not None:
            table.toggle_node(node)
            return
        self._show_log(None if pane.rank is not None else table.selected_rank())

    def action_all_logs(self) -> None:
        self._show_log(None)

    def action_follow(self) -> None:
        pane = self.query_one(LogPane)
        pane.set_follow(not pane.auto_scroll)
        self._update_log_title()

    def action_search(self) -> None:
        pane = self.query_one(LogPane)
        self.push_screen(SearchPrompt(pane.query_text), self._searched)

    def _searched(self, query: str | None) -> None:
        """Enter with a query: find it; with an empty one: clear the search; escape: nothing."""
        if query:
            self._search(query)
        elif query is not None:
            self.query_one(LogPane).clear_search()
            self._update_log_title()

    def _search(self, query: str, backwards: bool = False) -> None:
        number, total = self.query_one(LogPane).search(query, backwards)
        found = f"· '{query}': {number}/{total}" if total else f"· '{query}': no match"
        self._update_log_title(found)

    def action_search_next(self) -> None:
        query = self.query_one(LogPane).query_text
        if query:
            self._search(query)

    def action_search_previous(self) -> None:
        query = self.query_one(LogPane).query_text
        if query:
            self._search(query, backwards=True)

    def action_save_envelope(self) -> None:
        if self.ending is None or not (self.ending.envelope_path or self.ending.envelope):
            self.notify("The envelope is saved when the run has ended.")
            return
        text = self.ending.envelope_text()  # from memory if no file could be written
        directory = self.save_directory or default_save_directory()
        filename = f"forgelm-tui-envelope-{self.run_handle.run_id}.json"
        self.deliver_text(io.StringIO(text), save_directory=directory, save_filename=filename,
                          mime_type="application/json")
        self.saved_to = str(directory / filename)
        self.notify(f"Envelope saved to {self.saved_to}")

    def action_help(self) -> None:
        self.push_screen(HelpScreen(b for b in self.BINDINGS if isinstance(b, Binding)))

    def action_quit(self) -> None:  # type: ignore[override]
        """Textual's own quit (ctrl+q, the palette) takes the same path as q."""
        self.action_quit_run()

    def action_quit_run(self) -> None:
        """Every way out: after the run, quit with its code; during it, ask to cancel first."""
        if self.ending is not None:
            self.exit(self.ending.verdict.code)
            return
        if isinstance(self.screen, ConfirmCancel):
            return  # already asking
        if self.model.stop is not None:
            self.notify("Stopping: the verdict follows when every rank has ended (c kills now).")
            return
        self.push_screen(ConfirmCancel(self.run_handle.world_size, self.run_handle.grace),
                         self._confirmed)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The palette: every binding's action once (its description, its keys and tooltip:
        the key line and the help screen read the same list), then what has no key."""
        for binding, keys in actions(b for b in self.BINDINGS if isinstance(b, Binding)):
            yield SystemCommand(binding.description, f"{keys} · {binding.tooltip}",
                                functools.partial(self.run_action, binding.action))
        for title, text, action in PALETTE_ONLY:
            yield SystemCommand(title, text, functools.partial(self.run_action, action))


def default_save_directory() -> Path:
    downloads = Path.home() / "Downloads"
    return downloads if downloads.is_dir() else Path.cwd()


def build_app(run: RunHandle, **kwargs: Any) -> SupervisorApp:
    return SupervisorApp(run, **kwargs)
