"""The run's side of attach (SPEC §9): a Unix socket that serves a snapshot, then every event,
and takes commands (cancel, kill now, forward a signal) from viewers.

It never slows the run: events are encoded once for all viewers, and each viewer has a bounded
queue written by its own task. A viewer that asked for output tails in its hello (the attach
TUI) gets each rank's output coalesced about 10 times a second (control/tails.py), not every
chunk. A viewer that falls behind is cleared and sent a fresh snapshot (taken in a loop callback
of its own, never inside an emit); one that keeps falling behind, or stops reading, is dropped
and its connection aborted. The socket is 0600 in a run dir of the owner's; the peer's pid and
uid (SO_PEERCRED) name it in the envelope when it sends a command.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import socket
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from forgelm_tui.control import PROTOCOL, paths
from forgelm_tui.control.tails import TICK, OutputTails
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.codec import to_wire
from forgelm_tui.engine.controls import Controls
from forgelm_tui.engine.node_summary import EVERY_RANK, NOTHING, Watch
from forgelm_tui.engine.records import CancelSource
from forgelm_tui.signames import signal_name, signal_number

MAX_QUEUED_BYTES = 4 << 20  # per viewer; past it the viewer is resynchronised
MAX_RESYNCS = 3  # ...and past this many resyncs in a row without catching up, dropped
MAX_COMMAND_BYTES = 64 << 10
FLUSH_WAIT = 1.0  # at the end, how long viewers get to read the last events
MAX_WATCHED = 4096  # nodes one ``watch`` may name
# Events that do not wait for output tails to go first (periodic; their order against output
# tells a viewer nothing). Any other event sends the pending tails before it.
BESIDE_OUTPUT = (ev.RankSampled, ev.RankProgressed, ev.RankEvidenceChanged)


class Served(Controls, Protocol):
    """What the server needs of a run (run.Session): its commands are every controller's
    (engine/controls.py)."""

    @property
    def run_id(self) -> str: ...
    def snapshot(self) -> ev.RunSnapshot: ...
    def subscribe(self, listener: Callable[[ev.Event], None]) -> None: ...


def line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


OUTPUT_FIELDS = ("rank", "stream", "raw")  # RankOutput's, in order: the fast path's wire form


def event_line(event: ev.Event) -> bytes:
    """An ``event`` message. Output (nearly every byte of a flood) is built around its base64
    directly: the same bytes as ``line(... to_wire(event))``, for about a seventh of the CPU
    (json.dumps walks the whole base64 string); any other event goes through the codec."""
    if isinstance(event, ev.RankOutput) and _FAST_OUTPUT:
        return (b'{"type":"event","event":{"type":"RankOutput","rank":%d,"stream":"%s",'
                b'"raw":"%s"}}\n' % (event.rank, event.stream.value.encode(),
                                     base64.b64encode(event.raw)))
    return line({"type": "event", "event": to_wire(event)})


# A field added to RankOutput turns the fast path off (the codec then carries it).
_FAST_OUTPUT = tuple(f.name for f in dataclasses.fields(ev.RankOutput)) == OUTPUT_FIELDS


class Viewer:
    def __init__(self, server: ControlServer, writer: asyncio.StreamWriter, pid: int,
                 uid: int) -> None:
        self.server, self.writer, self.pid, self.uid = server, writer, pid, uid
        self.queue: deque[bytes] = deque()
        self.queued = 0
        self.resyncs = 0
        self.behind = False
        self.closed = False
        self.tail = False  # it asked for output tails in its hello (docs/control.md)
        self.watch = EVERY_RANK  # what it shows of other nodes, as it last said (``watch``)
        self.wake = asyncio.Event()

    def offer(self, data: bytes) -> None:
        if self.closed or self.behind:
            return
        if self.queued + len(data) > MAX_QUEUED_BYTES:
            self.behind = True
            self.queue.clear()
            self.queued = 0
            asyncio.get_running_loop().call_soon(self.resync)
            return
        self.queue.append(data)
        self.queued += len(data)
        self.wake.set()

    def resync(self) -> None:
        """A fresh snapshot instead of what it could not keep up with."""
        self.resyncs += 1
        if self.resyncs > MAX_RESYNCS:
            self.close(abort=True)  # it does not read: its unsent bytes would hold it open
            return
        self.behind = False
        for data in self.server.snapshot_lines():
            self.offer(data)

    async def pump(self) -> None:
        try:
            while not self.closed:
                await self.wake.wait()
                self.wake.clear()
                while self.queue and not self.closed:
                    data = self.queue.popleft()
                    self.queued -= len(data)
                    self.writer.write(data)
                    await self.writer.drain()
                if not self.queue:
                    self.resyncs = 0  # caught up
        except (ConnectionError, OSError):
            pass
        finally:
            self.close()

    def unsent(self) -> bool:
        """Lines still queued here or bytes still in the transport: a viewer closed before
        they go would read half a line."""
        transport = self.writer.transport
        return bool(self.queue) or (not transport.is_closing()
                                    and transport.get_write_buffer_size() > 0)

    def close(self, abort: bool = False) -> None:
        """Close its connection; ``abort``: at once, dropping what it has not read (a graceful
        close would wait, with the connection open, for a viewer that stopped reading)."""
        if not self.closed:
            self.closed = True
            self.wake.set()
            if abort:
                self.writer.transport.abort()
            else:
                self.writer.close()
            self.server.viewers.discard(self)

    def origin(self, via: str) -> str:
        return f"attached viewer (pid {self.pid}, uid {self.uid}, {via})"


class ControlServer:
    def __init__(self, session: Served) -> None:
        self.session = session
        self.viewers: set[Viewer] = set()
        self.path: Path | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.tails = OutputTails()
        self._tick: asyncio.TimerHandle | None = None
        self.nodes: dict[int, ev.NodeChanged] = {}  # other nodes, as last shown (multi-node)

    def watching(self) -> Watch:
        """What the attached viewers show of other nodes, together."""
        watch = NOTHING
        for viewer in self.viewers:
            watch = watch | viewer.watch
        return watch

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.NodeChanged):  # for a viewer that attaches later
            self.nodes[event.node_rank] = _kept(event, self.nodes.get(event.node_rank))
        if not self.viewers:
            return
        if isinstance(event, ev.RankOutput):
            self._output(event)
            return
        if self.tails and not isinstance(event, BESIDE_OUTPUT):
            self.flush_tails()  # the output before it, first (the last lines before the verdict)
        data = event_line(event)
        for viewer in list(self.viewers):
            viewer.offer(data)

    def _output(self, chunk: ev.RankOutput) -> None:
        """Every chunk to viewers that want every one (encoded once); tail viewers' later."""
        data, tailing = b"", False
        for viewer in list(self.viewers):
            if viewer.tail:
                tailing = True
            else:
                data = data or event_line(chunk)
                viewer.offer(data)
        if tailing:
            self.tails.add(chunk)
            if self._tick is None:
                self._tick = asyncio.get_running_loop().call_later(TICK, self.flush_tails)

    def flush_tails(self) -> None:
        """The output since the last tick to every tail viewer: how many lines were left out
        (a ``skipped`` message), then one output event per rank and stream."""
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        chunks, skipped = self.tails.take()
        messages = [line({"type": "skipped", "lines": sum(skipped.values()),
                          "ranks": {str(r): n for r, n in skipped.items()}})] if skipped else []
        messages += [event_line(c) for c in chunks]
        for viewer in [v for v in self.viewers if v.tail]:
            for data in messages:
                viewer.offer(data)

    def snapshot_lines(self) -> list[bytes]:
        """The snapshot (this node's ranks), then every other node as it was last shown: a
        node whose ranks no longer change is not sent again (cluster/views.py)."""
        return [line({"type": "snapshot", "snapshot": to_wire(self.session.snapshot())}),
                *(event_line(node) for _, node in sorted(self.nodes.items()))]

    async def start(self, run_dir: Path, name: str | None = None) -> Path | None:
        """Listen; None (and the run goes on) when no socket can be made."""
        try:
            path = paths.socket_path(run_dir, self.session.run_id)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            old = os.umask(0o177)  # the socket is 0600 from its first moment
            try:
                self._server = await asyncio.start_unix_server(self._connected, path=str(path))
            finally:
                os.umask(old)
        except OSError:
            return None
        self.path = path
        paths.register(name or self.session.run_id, {
            "run_id": self.session.run_id, "run_dir": str(run_dir), "socket": str(path),
            "pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()})
        return path

    async def close(self) -> None:
        """Give viewers a moment to read the verdict, then stop listening."""
        if self._server is not None:
            self._server.close()
        if self.tails:
            self.flush_tails()
        pending = [v for v in self.viewers if v.unsent()]
        deadline = asyncio.get_running_loop().time() + FLUSH_WAIT
        while pending and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
            pending = [v for v in pending if v.unsent() and not v.closed]
        for viewer in list(self.viewers):
            viewer.close(abort=viewer.unsent())  # one that did not read in time: at once
        for task in list(self._tasks):
            task.cancel()
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

    # ------------------------------------------------------------------ one viewer

    async def _connected(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        pid, uid = _peer(writer)
        if uid not in (os.getuid(), 0):
            writer.close()
            return
        viewer = Viewer(self, writer, pid, uid)
        # The snapshot and the subscription in one loop callback: no event falls between.
        viewer.offer(line({"v": PROTOCOL, "type": "hello", "run_id": self.session.run_id,
                           "pid": os.getpid()}))
        for data in self.snapshot_lines():
            viewer.offer(data)
        self.viewers.add(viewer)
        pump = asyncio.ensure_future(viewer.pump())
        self._tasks.add(pump)
        pump.add_done_callback(self._tasks.discard)
        try:
            while not viewer.closed:
                raw = await reader.readline()
                if not raw:
                    break
                self._command(viewer, raw)
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            viewer.close()

    def _command(self, viewer: Viewer, raw: bytes) -> None:
        try:
            message = json.loads(raw[:MAX_COMMAND_BYTES])
            kind, via = message["type"], str(message.get("via", "terminal"))[:20]
        except (ValueError, KeyError, TypeError):
            viewer.offer(line({"type": "error", "message": "not a command"}))
            return
        origin = viewer.origin(via)
        if kind == "hello":  # a viewer's own hello: what output it wants
            viewer.tail = message.get("output") == "tail"
            effect = "output tail" if viewer.tail else "output all"
        elif kind == "cancel":
            effect = self.session.request_cancel(origin, signal.SIGINT,
                                                 source=CancelSource.VIEWER)
        elif kind == "kill":
            self.session.kill_now(origin, CancelSource.VIEWER)
            effect = "kill"
        elif kind == "forward":
            sig = signal_number(str(message.get("signal", "")))
            if sig is None:
                viewer.offer(line({"type": "error", "message": "unknown signal"}))
                return
            self.session.forward(sig, origin, CancelSource.VIEWER)
            effect = f"forwarded {signal_name(sig)}"
        elif kind == "stacks":
            effect = "capturing" if self.session.request_stacks(origin) else "busy"
        elif kind == "watch":
            watch = _watch(message.get("nodes"))
            if watch is None:
                viewer.offer(line({"type": "error", "message": "nodes: a list of node ranks"}))
                return
            viewer.watch = watch
            effect = "every node" if watch.nodes is None else f"{len(watch.nodes)} node(s)"
        else:
            viewer.offer(line({"type": "error", "message": f"unknown command {kind!r}"}))
            return
        viewer.offer(line({"type": "ack", "command": kind, "effect": effect}))


def _watch(nodes: Any) -> Watch | None:
    """A viewer's ``watch``: the nodes whose ranks it shows (null: every node)."""
    if nodes is None:
        return EVERY_RANK
    if not isinstance(nodes, list) or len(nodes) > MAX_WATCHED or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in nodes):
        return None
    return Watch(True, frozenset(nodes))


def _kept(event: ev.NodeChanged, last: ev.NodeChanged | None) -> ev.NodeChanged:
    """A node as a later viewer gets it: a change of state alone keeps its ranks, and a rank
    whose view came without its curve (cluster/views.py) keeps the last one seen."""
    if last is None:
        return event
    if not event.ranks and event.summary is None:  # its state alone changed
        return dataclasses.replace(event, host=event.host or last.host, ranks=last.ranks,
                                   summary=last.summary, complete=last.complete)
    curves = {r.rank: r.metrics_history for r in last.ranks}
    return dataclasses.replace(event, ranks=tuple(
        r if r.metrics_history else dataclasses.replace(r, metrics_history=curves.get(r.rank, ()))
        for r in event.ranks))


def _peer(writer: asyncio.StreamWriter) -> tuple[int, int]:
    sock = writer.get_extra_info("socket")
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", data)
        return pid, uid
    except (OSError, AttributeError):
        return 0, -1


@contextlib.asynccontextmanager
async def serving(session: Served, run_dir: Callable[[], Path],
                  node: Callable[[], int | None] = lambda: None) -> AsyncIterator[ControlServer]:
    """Serve the run while the block runs: listening starts when the run starts (after a
    multi-node join has settled the run dir and node rank), and ends after the verdict. Each
    node of a multi-node run registers as ``<run id>-node<i>``."""
    server = ControlServer(session)
    loop = asyncio.get_running_loop()
    started: list[asyncio.Task[Path | None]] = []

    def on_event(event: ev.Event) -> None:
        server.on_event(event)
        if isinstance(event, ev.RunStarted) and not started:
            rank = node()
            name = None if rank is None else f"{session.run_id}-node{rank}"
            started.append(loop.create_task(server.start(run_dir(), name)))

    session.subscribe(on_event)
    try:
        yield server
    finally:
        if started:
            with contextlib.suppress(Exception):
                await started[0]
        await server.close()
