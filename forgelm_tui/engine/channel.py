"""The supervisor side of the progress channel: one abstract Unix datagram socket per run.

Ranks send small JSON messages (the protocol: ``forgelm_tui.channel``, docs/channel.md); the
supervisor reads them as events on its loop. No torch, no files, nothing to clean up: the socket
lives in the abstract namespace and vanishes with the supervisor.

An abstract socket has no file mode, and its name shows in /proc/net/unix to every user: the
kernel's credentials on each datagram (SO_PASSCRED) are checked, and a message from another
user is dropped (docs/security.md), so no one else can fake a rank's progress or stop report.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Callable

from forgelm_tui.channel import MAX_DATAGRAM, Message, channel_name, decode, socket_address


class ChannelServer:
    def __init__(self, run_id: str) -> None:
        self.name = channel_name(run_id, os.urandom(4).hex())
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.bind(socket_address(self.name))
        self._sock.setblocking(False)
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._uid = os.getuid()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop, handler: Callable[[Message], None]) -> None:
        self._loop = loop
        loop.add_reader(self._sock.fileno(), self._drain, handler)

    def _drain(self, handler: Callable[[Message], None]) -> None:
        for _ in range(256):  # bounded per wake-up; the loop calls again if more is queued
            try:
                data, ancillary, _, _ = self._sock.recvmsg(MAX_DATAGRAM * 2, CREDENTIALS_SIZE)
            except OSError:  # BlockingIOError included: nothing more queued
                return
            if sender_uid(ancillary) != self._uid:
                continue  # another user's datagram: never a rank of this run
            message = decode(data)
            if message is not None:
                handler(message)

    def close(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
CREDENTIALS_SIZE = socket.CMSG_SPACE(CREDENTIALS.size)


def sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The sending process's uid, as the kernel vouches for it; None if absent."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS \
                and len(data) >= CREDENTIALS.size:
            return int(CREDENTIALS.unpack(data[:CREDENTIALS.size])[1])
    return None
