"""The supervisor side of the progress channel: one abstract Unix datagram socket per run.

Ranks send small JSON messages (see ``forgelm_tui.rank.channel``); the supervisor reads them as
events on its loop. No torch, no files, nothing to clean up: the socket lives in the abstract
namespace and vanishes with the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]


class ChannelServer:
    def __init__(self, run_id: str) -> None:
        self.name = f"@forgelm-tui-{run_id}-{secrets.token_hex(4)}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.bind(b"\0" + self.name[1:].encode())
        self._sock.setblocking(False)
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop, handler: Callable[[Message], None]) -> None:
        self._loop = loop
        loop.add_reader(self._sock.fileno(), self._drain, handler)

    def _drain(self, handler: Callable[[Message], None]) -> None:
        for _ in range(256):  # bounded per wake-up; the loop calls again if more is queued
            try:
                data = self._sock.recv(16384)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                message = json.loads(data)
            except ValueError:
                continue
            if isinstance(message, dict) and isinstance(message.get("rank"), int):
                handler(message)

    def close(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
