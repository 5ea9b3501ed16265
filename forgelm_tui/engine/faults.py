"""An exception anywhere in the supervisor's event loop ends the run; it never hangs it.

Listeners (a view, the report, the control server), loop callbacks (a rank's exit, its output,
timers, the sampler's results), tasks: the first exception is kept as a
:class:`SupervisorError` and every rank is stopped (a cancel whose source is the supervisor
itself). The run then ends as any stopped run does, with its envelope (``supervisor_error``).
The verdict (:func:`fault_verdict`): 2 if ranks were still running when the stop was applied
(the run did not complete), else the ranks' own verdict stands.

Nothing is printed here: the error's one line reaches the views as the stop's reason.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from forgelm_tui.verdict import EXIT_TRAINING_ERROR, Verdict, describe

TRACEBACK_LINES = 16  # the innermost lines of the traceback kept in the envelope
MESSAGE_CHARS = 500


@dataclass(frozen=True)
class SupervisorError:
    type: str  # the exception's class name
    message: str
    where: str  # "listener HeadlessView", "loop callback ...", "session"
    traceback: tuple[str, ...]  # its innermost lines
    at: float
    ranks_running: bool = True  # some rank had not ended when the stop was applied

    @property
    def line(self) -> str:
        return f"{self.type}: {self.message} (in {self.where})"

    def to_dict(self, at: str | None) -> dict[str, Any]:
        """The envelope's ``supervisor_error`` (``at`` as the envelope writes times)."""
        return {"type": self.type, "message": self.message, "where": self.where,
                "traceback": list(self.traceback), "at": at,
                "ranks_running": self.ranks_running}


def describe_exception(exc: BaseException, where: str) -> SupervisorError:
    text = "".join(traceback.format_exception(exc)).rstrip("\n").splitlines()
    message = str(exc)
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    return SupervisorError(type(exc).__name__, message, where[:200],
                           tuple(text[-TRACEBACK_LINES:]), time.time())


def fault_verdict(error: SupervisorError) -> Verdict:
    """Ranks were still running: the run did not complete (rule 4), whatever the contract."""
    name, meaning, action = describe(EXIT_TRAINING_ERROR)
    text = (f"interrupted: forgelm-tui failed ({error.type}: {error.message}) and stopped "
            "the ranks")
    return Verdict(EXIT_TRAINING_ERROR, name, meaning, action, 4, text, None)


def listener_name(listener: object) -> str:
    owner = getattr(listener, "__self__", None)
    name = getattr(listener, "__qualname__", None) or type(listener).__qualname__
    return f"{type(owner).__qualname__}.{getattr(listener, '__name__', name)}" if owner else name


class FaultGuard:
    """Keeps the first error and, once the loop is back in control (never inside the code that
    raised), calls ``on_fault`` with it: ``running()`` says then whether ranks still run."""

    def __init__(self, on_fault: Callable[[SupervisorError], None],
                 running: Callable[[], bool]) -> None:
        self.error: SupervisorError | None = None
        self.count = 0  # every exception caught, the first one kept
        self._on_fault = on_fault
        self._running = running
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Catch the loop's own unhandled exceptions too (callbacks, tasks)."""
        self._loop = loop
        loop.set_exception_handler(self.loop_handler)

    def caught(self, exc: BaseException, where: str) -> None:
        self.count += 1
        if self.error is not None:
            return
        self.error = replace(describe_exception(exc, where), ranks_running=self._running())
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon(self._settle)
        else:
            self._settle()

    def _settle(self) -> None:
        assert self.error is not None
        self.error = replace(self.error, ranks_running=self._running())
        self._on_fault(self.error)

    def loop_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not isinstance(exc, Exception):
            loop.default_exception_handler(context)  # a warning (an unclosed resource...)
            return
        what = context.get("handle") or context.get("task") or context.get("future")
        where = f"loop callback {what!r}" if what is not None else str(context.get("message"))
        self.caught(exc, where)
