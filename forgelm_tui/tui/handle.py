"""What the app needs from a run: the real Session, or a scripted stand-in in the tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.controls import Controls
from forgelm_tui.session.ending import RunEnding


class RunHandle(Controls, Protocol):
    """What the app needs from a run: the real Session or a scripted stand-in; its commands
    are every controller's (engine/controls.py)."""

    @property
    def run_id(self) -> str: ...
    @property
    def command(self) -> list[str]: ...
    @property
    def world_size(self) -> int: ...
    @property
    def grace(self) -> float: ...

    def subscribe(self, listener: Callable[[ev.Event], None]) -> None: ...
    def cancelled_by_signal(self) -> bool: ...
    def run(self) -> Awaitable[RunEnding]: ...
