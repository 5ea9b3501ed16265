"""The rank side of the progress channel: small JSON datagrams to the supervisor.

No torch here. The supervisor names the channel in ``FORGELM_TUI_CHANNEL`` (an abstract Unix
datagram socket, ``@name``); outside forgelm-tui the variable is unset and every call is a
no-op. Sends never block and never raise: a full or absent supervisor only loses the message.
The messages are defined in ``forgelm_tui.channel`` (docs/channel.md). The first message a
process sends installs the stacks handler (``rank.stacks``) and announces it first.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from forgelm_tui.channel import CHANNEL_ENV, MessageKind, encode, socket_address
from forgelm_tui.rank.stacks import install as install_stacks

__all__ = ["CHANNEL_ENV", "Channel", "Heartbeats", "MessageKind", "default_channel",
           "heartbeat", "report_progress"]


class Channel:
    def __init__(self, address: str | None = None) -> None:
        name = address if address is not None else os.environ.get(CHANNEL_ENV)
        self._address = socket_address(name) if name else None
        self._sock: socket.socket | None = None
        self.rank = int(os.environ.get("RANK", "0"))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, kind: MessageKind, **fields: Any) -> None:
        if self._address is None:
            return
        install_stacks(self.send)  # the first message: announce the stacks handler before it
        data = encode(self.rank, kind, **fields)
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(data, self._address)
        except OSError:
            pass  # no supervisor listening, or its queue is full: progress is best effort

    def progress(self, step: int, total: int | None = None,
                 metrics: dict[str, float] | None = None) -> None:
        self.send(MessageKind.PROGRESS, step=step, total=total, metrics=metrics or {})

    def heartbeat(self) -> None:
        self.send(MessageKind.HEARTBEAT)


_default: Channel | None = None


def default_channel() -> Channel:
    global _default
    if _default is None:
        _default = Channel()
    return _default


def report_progress(step: int, total: int | None = None,
                    metrics: dict[str, float] | None = None) -> None:
    """Tell the supervisor how far this rank is (shown live, kept in the envelope)."""
    default_channel().progress(step, total, metrics)


def heartbeat() -> None:
    """Tell the supervisor this rank is alive though silent (it is then never 'stalled')."""
    default_channel().heartbeat()


class Heartbeats:
    """Heartbeats from hooks that run often (every evaluation batch): at most one every
    ``every`` seconds, unless forced (a hook that runs once: evaluation done, checkpoint saved).
    Call it from the main thread only: a heartbeat says the training loop itself is alive."""

    def __init__(self, channel: Channel | None = None, every: float = 1.0) -> None:
        self.channel = channel
        self.every = every
        self._last: float | None = None

    def beat(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or self._last is None or now - self._last >= self.every:
            self._last = now
            (self.channel or default_channel()).heartbeat()
