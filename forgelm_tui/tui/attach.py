"""`forgelm-tui attach`: the operator's TUI on a run started elsewhere (SPEC §9), fed from the
run's control socket: the same table, logs, cancel, kill, forward and verdict. Leaving (`d`,
`q` during the run, a closed terminal) detaches; the run goes on."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from forgelm_tui.control.client import ControlClient, ControlError
from forgelm_tui.ending import RunEnding
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.records import CancelSource
from forgelm_tui.signames import signal_name
from forgelm_tui.tui.app import SupervisorApp
from forgelm_tui.tui.attempt import restore
from forgelm_tui.verdict import Verdict

HISTORY_BYTES = 64 << 10  # of each rank's log files, shown before the live stream


class Detached(Exception):
    """The viewer left; the run goes on."""


class AttachedRun:
    """A RunHandle (tui/handle.py) on a control socket."""

    def __init__(self, client: ControlClient, read_only: bool = False,
                 via: str = "terminal") -> None:
        self.client = client
        self.read_only = read_only
        self.via = via  # how the operator reaches this viewer: recorded with each command
        first = client.next_item()
        if not isinstance(first, ev.RunSnapshot):
            raise ControlError("the run sent no snapshot")
        self.snapshot = first
        self.listeners: list[Callable[[ev.Event], None]] = []
        self.on_snapshot: Callable[[ev.RunSnapshot], None] = lambda snapshot: None
        self.detached = False

    @property
    def run_id(self) -> str:
        return self.snapshot.run_id

    @property
    def command(self) -> list[str]:
        return list(self.snapshot.argv)

    @property
    def world_size(self) -> int:
        return self.snapshot.world_size

    @property
    def grace(self) -> float:
        return self.snapshot.stop.grace if self.snapshot.stop else 30.0

    def subscribe(self, listener: Callable[[ev.Event], None]) -> None:
        self.listeners.append(listener)

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT, *,
                       source: CancelSource = CancelSource.OPERATOR,
                       cause: str | None = None) -> str:
        if source is CancelSource.TERMINAL:  # this viewer's terminal closed: it leaves
            self.detach()
            return "merged"
        if self.read_only:
            return "merged"
        self.client.send("cancel", via=self.via)
        return "stop"

    def kill_now(self, origin: str = "operator") -> None:
        if not self.read_only:
            self.client.send("kill", via=self.via)

    def forward(self, sig: int) -> None:
        if not self.read_only:
            self.client.send("forward", via=self.via, signal=signal_name(sig))

    def cancelled_by_signal(self) -> bool:
        return False

    def detach(self) -> None:
        self.detached = True
        with contextlib.suppress(OSError):
            self.client.close()

    async def run(self) -> RunEnding:
        """Deliver the snapshot, the logs so far, then events, until the verdict."""
        loop = asyncio.get_running_loop()
        for chunk in log_history(self.snapshot):
            self._deliver(chunk)
        done: asyncio.Future[RunEnding] = loop.create_future()
        thread = threading.Thread(target=self._read, args=(loop, done), daemon=True,
                                  name="forgelm-tui-attach")
        thread.start()
        return await done

    def _read(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[RunEnding]) -> None:
        try:
            while True:
                item = self.client.next_item()
                if isinstance(item, ev.VerdictReached):
                    loop.call_soon_threadsafe(self._deliver, item)
                    loop.call_soon_threadsafe(_settle, done, ending_of(item))
                    return
                if isinstance(item, ev.RunSnapshot):  # it fell behind: a fresh start
                    loop.call_soon_threadsafe(self.on_snapshot, item)
                elif not isinstance(item, dict):
                    loop.call_soon_threadsafe(self._deliver, item)
        except (ControlError, OSError, ValueError) as exc:
            ended = None if self.detached else ended_from_envelope(self.snapshot.run_dir)
            with contextlib.suppress(RuntimeError):
                if ended is not None:  # dropped, or the run ended as we read: its envelope
                    loop.call_soon_threadsafe(_settle, done, ended)
                else:
                    error = Detached() if self.detached else ControlError(str(exc))
                    loop.call_soon_threadsafe(_fail, done, error)

    def _deliver(self, item: ev.Event) -> None:
        for listener in self.listeners:
            listener(item)


def _settle(done: asyncio.Future[RunEnding], ending: RunEnding) -> None:
    if not done.done():
        done.set_result(ending)


def _fail(done: asyncio.Future[RunEnding], error: BaseException) -> None:
    if not done.done():
        done.set_exception(error)


def ended_from_envelope(run_dir: str, wait: float = 3.0) -> RunEnding | None:
    """The run's ending from its final envelope, when the connection went before the verdict
    (a viewer dropped for falling behind, or the run ending as it was read). The supervisor
    writes the envelope before it closes the socket; a moment is given for that write."""
    import time

    path = Path(run_dir) / "envelope.json"
    deadline = time.monotonic() + wait
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            envelope = json.loads(path.read_text(encoding="utf-8"))
            if not envelope.get("provisional"):
                decided = envelope["decided_by"]
                verdict = Verdict(envelope["exit_code"], envelope["exit_name"],
                                  envelope["exit_meaning"], envelope["ci_action"],
                                  decided["rule"], decided["explanation"], decided["rank"])
                return RunEnding(verdict, envelope, str(path), ())
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def ending_of(verdict: ev.VerdictReached) -> RunEnding:
    envelope: dict[str, Any] = {}
    if verdict.envelope_path:
        with contextlib.suppress(OSError, ValueError):
            envelope = json.loads(Path(verdict.envelope_path).read_text(encoding="utf-8"))
    return RunEnding(verdict.verdict, envelope, verdict.envelope_path, ())


def log_history(snapshot: ev.RunSnapshot) -> list[ev.RankOutput]:
    """The end of each rank's log files, so the log pane is not empty on attach."""
    chunks = []
    for rank in snapshot.ranks:
        for stream in (ev.Stream.STDOUT, ev.Stream.STDERR):
            path = Path(snapshot.run_dir) / f"rank-{rank.rank}.{stream.value}.log"
            with contextlib.suppress(OSError), open(path, "rb") as handle:
                handle.seek(0, 2)
                size = handle.tell()
                handle.seek(max(0, size - HISTORY_BYTES))
                raw = handle.read()
                if size > HISTORY_BYTES:
                    raw = raw.split(b"\n", 1)[-1]
                raw = raw.rstrip(b"\n")
                if raw:
                    chunks.append(ev.RankOutput(rank.rank, stream, raw))
    return chunks


class AttachApp(SupervisorApp):
    # The whole list, not only d: the key line and the help screen are built from BINDINGS.
    BINDINGS = [
        *SupervisorApp.BINDINGS,
        Binding("d", "detach", "Detach", tooltip="leave this viewer; the run goes on"),
    ]

    def __init__(self, run: AttachedRun, **kwargs: Any) -> None:
        super().__init__(run, **kwargs)
        restore(self.model, run.snapshot)  # the run as it is now; events follow
        run.on_snapshot = lambda snapshot: restore(self.model, snapshot)

    def action_detach(self) -> None:
        handle = self.run_handle
        assert isinstance(handle, AttachedRun)
        handle.detach()
        self.exit(None)

    def action_quit_run(self) -> None:
        if self.ending is None:  # leaving a viewer never stops the run
            self.action_detach()
            return
        super().action_quit_run()

    def action_save_envelope(self) -> None:
        """In a browser (forgelm-tui serve) `s` is a real download: the envelope file's exact
        bytes, delivered through textual-serve; in a terminal, a file as in the launching TUI."""
        if not self.is_web or self.ending is None or not self.ending.envelope_path:
            super().action_save_envelope()
            return
        self.saved_to = deliver_envelope(self, Path(self.ending.envelope_path),
                                         self.run_handle.run_id)

    async def _run(self) -> None:
        try:
            await super()._run()
        except Detached:
            return
        except ControlError as exc:
            self.notify(f"lost the run: {exc}", severity="error", timeout=10)


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


def execute_attach(target: str | None, read_only: bool, say: Callable[[str], None],
                   via: str = "terminal") -> int:
    """Find the run, attach, and return: the run's code after `q`, 0 after a detach, 1 when
    there is no run to attach to (one line; no run dir, no envelope)."""
    from forgelm_tui.control.find import NotFound, find_run
    from forgelm_tui.tui.launch import _terminal_fd

    try:
        run = find_run(target)
    except NotFound as exc:
        say(f"forgelm-tui attach: {exc}")
        return 1
    if not run.live:
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
    try:
        assert run.socket is not None
        handle = AttachedRun(ControlClient(run.socket), read_only, via)
    except ControlError as exc:
        say(f"forgelm-tui attach: {exc}")
        return 1
    app = AttachApp(handle, terminal_fd=_terminal_fd())
    code = app.run()
    if handle.detached or code is None:
        say(f"forgelm-tui: detached from run {handle.run_id}; it goes on "
            f"(forgelm-tui attach {handle.run_id})")
        return 0
    return code
