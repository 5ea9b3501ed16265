"""Named one-shot timers on an asyncio loop, the form the stop policy takes them in."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class LoopTimers:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handles: dict[str, asyncio.TimerHandle] = {}

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def start(self, name: str, delay: float, callback: Callable[[], None]) -> None:
        """(Re)start ``name``: a timer of that name already running is replaced."""
        self.cancel(name)
        assert self._loop is not None, "timers start once the run's loop is bound"
        self._handles[name] = self._loop.call_later(delay, self._fire, name, callback)

    def _fire(self, name: str, callback: Callable[[], None]) -> None:
        self._handles.pop(name, None)
        callback()

    def cancel(self, name: str) -> None:
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.cancel()

    def cancel_all(self) -> None:
        for name in list(self._handles):
            self.cancel(name)
