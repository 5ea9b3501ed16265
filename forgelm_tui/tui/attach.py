"""`forgelm-tui attach`: the operator's TUI on a run started elsewhere (SPEC §9), fed from the
run's control socket: the same table, logs, cancel, kill, forward, stacks and verdict. Leaving
(`d`, `q` during the run, a closed terminal) detaches; the run goes on. A connection that drops
mid-run is made again (a fresh snapshot); one that goes as the run ends shows its envelope."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.binding import Binding

from forgelm_tui.cluster.kill_wait import DEFAULT_GRACE
from forgelm_tui.control.client import ControlClient, ControlError
from forgelm_tui.control.find import KnownRun
from forgelm_tui.control.reconnect import connect_again
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.node_summary import Watch
from forgelm_tui.engine.records import CancelSource
from forgelm_tui.engine.signal_inbox import Sender
from forgelm_tui.session.ending import RunEnding
from forgelm_tui.signames import signal_name
from forgelm_tui.tui.app import SupervisorApp
from forgelm_tui.tui.attempt import restore
from forgelm_tui.tui.ended import deliver_envelope, show_ended
from forgelm_tui.tui.logs import LogStore
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
        self.on_skipped: Callable[[int], None] = lambda lines: None  # output left out
        self.on_reconnecting: Callable[[], None] = lambda: None
        self.detached = False
        self.watched: Watch | None = None  # what it told the run it shows (``watch``)

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
        """The run's grace in force, as its supervisor said (``Supervisor.grace_in_force``);
        the default only for a snapshot without it (the field is optional on the wire)."""
        return self.snapshot.grace if self.snapshot.grace is not None else DEFAULT_GRACE

    def subscribe(self, listener: Callable[[ev.Event], None]) -> None:
        self.listeners.append(listener)

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT, *,
                       source: CancelSource = CancelSource.OPERATOR,
                       sender: Sender | None = None) -> str:
        if source is CancelSource.TERMINAL:  # this viewer's terminal closed: it leaves
            self.detach()
            return "merged"
        return "stop" if self._send("cancel") else "merged"

    def kill_now(self, origin: str = "operator",
                 source: CancelSource = CancelSource.OPERATOR) -> None:
        self._send("kill")

    def forward(self, sig: int, origin: str | None = "operator",
                source: CancelSource = CancelSource.OPERATOR,
                sender: Sender | None = None) -> None:
        self._send("forward", signal=signal_name(sig))

    def request_stacks(self, origin: str = "operator") -> bool:
        """Ask the run for every rank's stacks (its StacksCaptured event follows)."""
        return self._send("stacks")

    def watch(self, watch: Watch) -> None:
        """Tell the run which other nodes' ranks this viewer shows (cluster/views.py); said
        again after a reconnection. Not a command: a read-only viewer says it too."""
        self.watched = watch
        nodes = None if watch.nodes is None else sorted(watch.nodes)
        with contextlib.suppress(OSError):
            self.client.send("watch", via=self.via, nodes=nodes)

    def _send(self, kind: str, **fields: Any) -> bool:
        """A command to the run; False when read-only or not connected (reconnecting)."""
        if self.read_only:
            return False
        try:
            self.client.send(kind, via=self.via, **fields)
        except OSError:
            return False
        return True

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
        """Read until the verdict; a connection lost mid-run is made again (bounded), one lost
        as the run ends gives way to its envelope."""
        while True:
            try:
                self._stream(loop, done)
                return
            except (ControlError, OSError, ValueError) as exc:
                lost = exc
            run_dir = self.snapshot.run_dir
            ended = None if self.detached else ended_from_envelope(run_dir, 0, self.run_id)
            client = None
            if ended is None and not self.detached:
                with contextlib.suppress(RuntimeError):  # the app may be gone
                    loop.call_soon_threadsafe(self.on_reconnecting)
                client = connect_again(self.client.path, self.client.supervisor_pid,
                                       give_up=lambda: self.detached)
            if client is not None:
                self.client = client  # its first item is a fresh snapshot
                if self.watched is not None:
                    self.watch(self.watched)
                continue
            if ended is None and not self.detached:  # the run is gone: did it leave a verdict?
                ended = ended_from_envelope(run_dir, run_id=self.run_id)
            with contextlib.suppress(RuntimeError):
                if ended is not None:  # dropped, or the run ended as we read: its envelope
                    loop.call_soon_threadsafe(_settle, done, ended)
                else:
                    error = Detached() if self.detached else ControlError(str(lost))
                    loop.call_soon_threadsafe(_fail, done, error)
            return

    def _stream(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[RunEnding]) -> None:
        while True:
            item = self.client.next_item()
            if isinstance(item, ev.VerdictReached):
                loop.call_soon_threadsafe(self._deliver, item)
                loop.call_soon_threadsafe(_settle, done, ending_of(item))
                return
            if isinstance(item, ev.RunSnapshot):  # a fresh start: it fell behind, or reconnected
                self.snapshot = item
                loop.call_soon_threadsafe(self.on_snapshot, item)
            elif isinstance(item, dict):
                if item.get("type") == "skipped":
                    loop.call_soon_threadsafe(self.on_skipped, int(item.get("lines") or 0))
            else:
                loop.call_soon_threadsafe(self._deliver, item)

    def _deliver(self, item: ev.Event) -> None:
        for listener in self.listeners:
            listener(item)


def _settle(done: asyncio.Future[RunEnding], ending: RunEnding) -> None:
    if not done.done():
        done.set_result(ending)


def _fail(done: asyncio.Future[RunEnding], error: BaseException) -> None:
    if not done.done():
        done.set_exception(error)


def ended_from_envelope(run_dir: str, wait: float = 3.0,
                        run_id: str | None = None) -> RunEnding | None:
    """The run's ending from its final envelope, when the connection went before the verdict
    (a viewer dropped for falling behind, or the run ending as it was read). The supervisor
    writes the envelope before it closes the socket; a moment is given for that write."""
    import time

    path = Path(run_dir) / "envelope.json"
    deadline = time.monotonic() + wait
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            envelope = json.loads(path.read_text(encoding="utf-8"))
            if not envelope.get("provisional") and run_id in (None, envelope.get("run_id")):
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


class ViewerLogs(LogStore):
    """The log store of a viewer that gets output tails: it counts the lines the run left out
    (the log pane says how many, as when a flood outruns the launching TUI)."""

    def skip(self, lines: int) -> None:
        self.total += lines
        self._pending.dropped += lines


class AttachApp(SupervisorApp):
    # The whole list, not only d: the key line and the help screen are built from BINDINGS.
    BINDINGS = [
        *SupervisorApp.BINDINGS,
        Binding("d", "detach", "Detach", tooltip="leave this viewer; the run goes on"),
    ]

    def __init__(self, run: AttachedRun, **kwargs: Any) -> None:
        super().__init__(run, **kwargs)
        self.model.logs = ViewerLogs()
        restore(self.model, run.snapshot)  # the run as it is now; events follow
        self.reconnecting = False
        run.on_snapshot = self._fresh_snapshot
        run.on_skipped = self.model.logs.skip
        run.on_reconnecting = self._reconnecting

    def refresh_table(self) -> None:
        super().refresh_table()
        run = self.run_handle
        if isinstance(run, AttachedRun) and self.model.nnodes > 1 \
                and self.watching() != run.watched:
            run.watch(self.watching())

    def _reconnecting(self) -> None:
        """The connection dropped mid-run: say so until a fresh snapshot comes."""
        self.reconnecting = True
        self.model.state = "reconnecting…"
        self.refresh_table()
        self.notify("Lost the connection to the run: reconnecting…", severity="warning")

    def _fresh_snapshot(self, snapshot: ev.RunSnapshot) -> None:
        restore(self.model, snapshot)
        self.refresh_table()
        if self.reconnecting:
            self.reconnecting = False
            self.notify("Reconnected: the run as it is now (the rank logs have every line).")

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
        return show_ended(run, via, say)
    try:
        handle = open_run(run, read_only, via)
    except ControlError as exc:
        say(f"forgelm-tui attach: {exc}")
        return 1
    if handle is None:  # it ended between finding it and connecting: its verdict
        return show_ended(run, via, say)
    app = AttachApp(handle, terminal_fd=_terminal_fd())
    code = app.run()
    if handle.detached or code is None:
        say(f"forgelm-tui: detached from run {handle.run_id}; it goes on "
            f"(forgelm-tui attach {handle.run_id})")
        return 0
    return code


def open_run(run: KnownRun, read_only: bool, via: str) -> AttachedRun | None:
    """Connect and read the snapshot; None when the run ended in the meantime (its socket went,
    or the connection closed before the snapshot, and its final envelope is there)."""
    assert run.socket is not None
    try:
        return AttachedRun(ControlClient(run.socket, output="tail"), read_only, via)
    except ControlError as exc:
        first = exc
    # The supervisor writes its envelope before it closes the socket, then gives viewers up to
    # FLUSH_WAIT (1 s) before it removes the socket: a little longer than that.
    if ended_from_envelope(str(run.run_dir), 1.5, run_id=run.run_id) is not None:
        return None
    client = connect_again(run.socket, run.pid, tries=3)
    if client is None:
        raise first
    return AttachedRun(client, read_only, via)
