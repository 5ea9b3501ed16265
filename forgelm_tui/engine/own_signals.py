"""The supervisor process's own signal handlers: what each signal *to forgelm-tui* does.

| signal | action |
|---|---|
| SIGINT, SIGTERM, SIGHUP | a cancel (a distinct second one kills at once; SIGHUP is a hang-up) |
| SIGQUIT | every live rank's stacks; the run goes on (forwarded if in --forward-signals) |
| SIGUSR1, SIGUSR2 | forwarded to every rank's main process (``--forward-signals`` chooses) |
| SIGPIPE | ignored: a closed stdout is EPIPE, handled where it is written (the output sink) |
| SIGTTOU | ignored: a backgrounded run writing to its terminal is not stopped |

The handlers run on the event loop (``loop.add_signal_handler``), with the signal's sender when
the inbox knows it (engine/signal_inbox.py), and go to a :class:`SignalTarget`: the running
attempt's supervisor, or the session between two attempts.
SIGPIPE and SIGTTOU are ignored for the whole process (``ignore_terminal_signals``): ranks
inherit that, and it changes nothing for them (their output is pipes, their session has no
terminal; Python, the ranks' usual interpreter, ignores SIGPIPE itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import Callable, Sequence
from typing import Protocol

from forgelm_tui import early_signals
from forgelm_tui.engine import signal_inbox
from forgelm_tui.engine.controls import Controls
from forgelm_tui.engine.records import CancelSource
from forgelm_tui.engine.signal_inbox import Sender
from forgelm_tui.signames import signal_name

STOP_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STACKS_REQUEST = signal.SIGQUIT  # to the supervisor: every rank's stacks, the run goes on
IGNORED: tuple[int, ...] = (signal.SIGPIPE, signal.SIGTTOU)


class SignalTarget(Controls, Protocol):
    def signalled(self, sig: int, sender: Sender | None = ...) -> None: ...  # a cancel


def ignore_terminal_signals() -> None:
    """SIGPIPE and SIGTTOU ignored for the whole process (see the table above)."""
    for sig in IGNORED:
        with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to do
            signal.signal(sig, signal.SIG_IGN)


def hold_early() -> None:
    """At the CLI's start: the usual signals (``early_signals.EARLY``: the stop signals, SIGQUIT
    and the default forwards, blocked from the console script's first line) wait for the run's
    handlers (signal_inbox)."""
    signal_inbox.hold_early(early_signals.EARLY)


def take_senders(forward_signals: Sequence[int]) -> bool:
    """From now on, know who sent each signal handled here (engine/signal_inbox.py). Call
    before any thread starts; False where that is too late (nothing changes then)."""
    return signal_inbox.start((*STOP_SIGNALS, STACKS_REQUEST, *forward_signals))


class OwnSignals:
    """Installs the handlers on the running loop; ``remove`` restores the defaults."""

    def __init__(self, target: SignalTarget, forward_signals: Sequence[int]) -> None:
        self.target = target
        self.forward_signals = tuple(forward_signals)
        self._installed: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        ignore_terminal_signals()
        for sig in STOP_SIGNALS:
            self._add(sig, functools.partial(self._stop, sig))
        if STACKS_REQUEST not in self.forward_signals:  # forwarding it wins
            self._add(STACKS_REQUEST, self._stacks)
        for sig in self.forward_signals:  # --forward-signals refuses the stop signals
            self._add(sig, functools.partial(self._forward, sig))

    def _stop(self, sig: int, sender: Sender | None) -> None:
        self.target.signalled(sig, sender)

    def _stacks(self, sender: Sender | None) -> None:
        self.target.request_stacks(f"{signal_name(STACKS_REQUEST)} to the supervisor")

    def _forward(self, sig: int, sender: Sender | None) -> None:
        self.target.forward(sig, None, CancelSource.SIGNAL, sender)

    def _add(self, sig: int, handler: Callable[[Sender | None], None]) -> None:
        """The inbox's route, with the sender; and the ordinary handler, for a signal delivered
        the ordinary way (while a rank is being spawned; no inbox), sender unknown."""
        assert self._loop is not None
        self._loop.add_signal_handler(sig, handler, None)
        signal_inbox.route(sig, self._loop, handler)
        self._installed.append(sig)

    def remove(self) -> None:
        if self._loop is None:
            return
        for sig in self._installed:
            signal_inbox.route(sig, self._loop, None)
            with contextlib.suppress(ValueError, RuntimeError):  # the loop may be closed
                self._loop.remove_signal_handler(sig)
        self._installed.clear()
