"""A viewer's side of attach: connect to a run's control socket, read the hello, the snapshot
and events as data, send commands (docs/control.md). Blocking and small: the attach TUI and the
tests use it from a thread of their own."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import Any

from forgelm_tui.control import PROTOCOL
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.codec import from_wire


class ControlError(Exception):
    """No run answers there (no socket, a dead run, not a forgelm-tui socket)."""


class ControlClient:
    """``output``: "all" (every output chunk, the default) or "tail" (each rank's output
    coalesced about 10 times a second, with ``skipped`` messages counting what was left out:
    what a viewer that shows a tail needs; said in this viewer's hello)."""

    def __init__(self, path: Path | str, timeout: float = 10.0, output: str = "all") -> None:
        self.path = Path(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except OSError as exc:
            self.sock.close()
            raise ControlError(f"{path}: no run answers ({exc.strerror or exc})") from None
        self._file = self.sock.makefile("rb")
        try:
            hello = self.read()
        except (ControlError, ValueError) as exc:
            self.close()
            raise ControlError(f"{path}: no hello from the run ({exc})") from None
        if hello.get("type") != "hello":
            self.close()
            raise ControlError(f"{path}: not a forgelm-tui control socket")
        if hello.get("v") != PROTOCOL:
            self.close()
            raise ControlError(f"{path}: the run speaks control protocol v{hello.get('v')}, this "
                               f"forgelm-tui v{PROTOCOL}: attach with the forgelm-tui that "
                               "started the run")
        self.run_id: str = hello["run_id"]
        self.supervisor_pid: int = hello["pid"]
        if output != "all":
            try:
                self.send("hello", v=PROTOCOL, output=output)
            except OSError as exc:
                self.close()
                raise ControlError(f"{path}: connection lost ({exc})") from None
        # The timeout covers connecting and the hellos: a run may then be quiet for long (a
        # restart's backoff), which is no lost connection.
        self.sock.settimeout(None)

    def read(self) -> dict[str, Any]:
        """The next message; ControlError at the end of the stream."""
        try:
            raw = self._file.readline()
        except OSError as exc:
            raise ControlError(f"connection lost ({exc})") from None
        if not raw:
            raise ControlError("the run closed the connection")
        message: dict[str, Any] = json.loads(raw)
        return message

    def next_item(self) -> ev.Event | ev.RunSnapshot | dict[str, Any]:
        """An event or snapshot, decoded; other messages (ack, error) as they are."""
        message = self.read()
        if message.get("type") == "event":
            event: ev.Event = from_wire(message["event"])
            return event
        if message.get("type") == "snapshot":
            snapshot: ev.RunSnapshot = from_wire(message["snapshot"])
            return snapshot
        return message

    def send(self, kind: str, via: str = "terminal", **fields: Any) -> None:
        data = json.dumps({"type": kind, "via": via, **fields}) + "\n"
        self.sock.sendall(data.encode())

    def close(self) -> None:
        """Close at once, even while another thread waits in :meth:`read` (the shutdown wakes
        it; closing the file first would wait for the run's next message)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self._file.close()
        self.sock.close()
