"""The rank side of the progress channel: small JSON datagrams to the supervisor.

No torch here. The supervisor names the channel in ``FORGELM_TUI_CHANNEL`` (an abstract Unix
datagram socket, ``@name``); outside forgelm-tui the variable is unset and every call is a
no-op. Sends never block and never raise. The supervisor's queue holds 10 datagrams
(``net.unix.max_dgram_qlen``): a supervisor busy for a moment on a loaded machine fills it,
and a message sent then is kept, not lost: it goes out, in order, before the next message, and
at the process's exit the rest is tried for up to ``EXIT_FLUSH_S``. Of the kinds that state
where the rank is (progress, heartbeat, collective counts) only the newest waits, so a rank's
last step reaches the envelope whatever was dropped on the way (a CI run saw step 18 of 20).
At most ``MAX_PENDING`` wait; an absent supervisor (nobody at the address) drops them all.
The messages are defined in ``forgelm_tui.channel`` (docs/channel.md). The first message a
process sends installs the stacks handler (``rank.stacks``) and announces it first.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from collections import deque
from typing import Any

from forgelm_tui.channel import CHANNEL_ENV, MessageKind, encode, socket_address
from forgelm_tui.rank.stacks import install as install_stacks

__all__ = ["CHANNEL_ENV", "Channel", "Heartbeats", "MessageKind", "default_channel",
           "heartbeat", "report_progress"]

NEWEST_ONLY = frozenset({MessageKind.PROGRESS, MessageKind.HEARTBEAT, MessageKind.COLLECTIVES})
MAX_PENDING = 64
EXIT_FLUSH_S = 0.5  # at exit, how long what still waits is tried (only when something waits)
_FULL = (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS)


class Channel:
    def __init__(self, address: str | None = None) -> None:
        name = address if address is not None else os.environ.get(CHANNEL_ENV)
        self._address = socket_address(name) if name else None
        self._sock: socket.socket | None = None
        self.rank = int(os.environ.get("RANK", "0"))
        self._pending: deque[tuple[MessageKind, bytes]] = deque()
        self._flush_at_exit = False

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, kind: MessageKind, **fields: Any) -> None:
        if self._address is None:
            return
        install_stacks(self.send)  # the first message: announce the stacks handler before it
        pending = self._pending  # one deque for good: another thread may be sending from it
        for older in [p for p in pending if p[0] is kind] if kind in NEWEST_ONLY else []:
            with contextlib.suppress(ValueError):
                pending.remove(older)
        if len(pending) >= MAX_PENDING:
            with contextlib.suppress(IndexError):
                pending.popleft()
        pending.append((kind, encode(self.rank, kind, **fields)))
        self.flush()

    def flush(self) -> bool:
        """Send what waits, in order; True when nothing waits any more. Each message is taken
        out before it is sent and put back if refused: a send from a signal handler in the
        middle of this one may change the order, never lose or repeat a message."""
        pending, address = self._pending, self._address
        while address is not None:
            try:
                message = pending.popleft()
            except IndexError:
                return True
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX,
                                               socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                    self._sock.setblocking(False)
                self._sock.sendto(message[1], address)
            except OSError as exc:
                if exc.errno not in _FULL:  # nobody listens: best effort, nothing is kept
                    pending.clear()
                    return True
                pending.appendleft(message)
                if not self._flush_at_exit:
                    import atexit

                    self._flush_at_exit = True
                    atexit.register(self.flush_until, EXIT_FLUSH_S)
                return False
        pending.clear()
        return True

    def flush_until(self, seconds: float) -> bool:
        """At exit: try what still waits for up to ``seconds``."""
        deadline = time.monotonic() + seconds
        while not self.flush():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

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
