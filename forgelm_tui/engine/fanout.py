"""Events out to listeners: held while signals go out, and a listener's exception never stops
the others (it is reported, and the supervisor stops the ranks: docs/signals.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from forgelm_tui.engine import events as ev

Listener = Callable[[ev.Event], None]


class Fanout:
    def __init__(self, on_error: Callable[[Exception, Listener], None]) -> None:
        self.listeners: list[Listener] = []
        self.urgent: list[Listener] = []  # given every held event before the others get any
        self.held: list[ev.Event] | None = None
        self._on_error = on_error

    def emit(self, event: ev.Event) -> None:
        if self.held is not None:
            self.held.append(event)
            return
        self._deliver(event, self.urgent + self.listeners)

    def _deliver(self, event: ev.Event, listeners: list[Listener]) -> None:
        for listener in listeners:
            try:
                listener(event)
            except Exception as exc:  # a view's bug: recorded, the ranks stopped, never a hang
                self._on_error(exc, listener)

    @contextlib.contextmanager
    def signals_first(self) -> Iterator[list[ev.Event]]:
        """Hold events while signals go out: no view work delays a peer's SIGTERM. Yields the
        held list (an event may go first)."""
        if self.held is not None:
            yield self.held
            return
        self.held = []
        try:
            yield self.held
        finally:
            held, self.held = self.held, None
            for listeners in (self.urgent, self.listeners):  # a stop's broadcast before views
                for event in held:
                    self._deliver(event, listeners)
