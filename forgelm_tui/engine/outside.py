"""Signals from outside forgelm-tui: which are one request, which rank deaths they explain.

Rules (SPEC §10), applied by the stop policy with its injected clock:

- A repeat from the sender of an earlier request is the same request when the sender is the
  scheduler's own process (slurmstepd) or outside this PID namespace (``si_pid`` 0: a container
  runtime), whenever it comes: slurmstepd sends SIGTERM, SIGCONT, SIGTERM at a time limit, and
  with preemption's GraceTime a second SIGTERM GraceTime seconds later; neither may kill ranks
  mid-checkpoint. Any other process's repeat within :data:`BURST_S` of its first is the same
  burst. A key at the terminal (``SI_KERNEL``) and a different process are a person asking
  again: that escalates, as a second cancel always did.
- A scheduler signals every process of the step, ranks included, within milliseconds. A rank
  that dies of SIGTERM / SIGINT / SIGHUP forgelm-tui did not send, within :data:`BURST_S` of the
  supervisor receiving the same signal from outside, died of that outside stop (SPEC §5 rule 4),
  not on its own. When the rank's death is seen first, the policy waits up to BURST_S for the
  supervisor's own copy before calling it a failure.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from forgelm_tui.engine.signal_inbox import Sender, SenderKind

BURST_S = 1.0
# What a scheduler (or a person's kill) sends to stop a job: a rank dying of one of these that
# forgelm-tui did not send may have got it from the same sender as the supervisor.
OUTSIDE_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


class OutsideSignals:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._first_from: dict[tuple[str, int], float] = {}
        self._received: dict[int, float] = {}  # signal -> when the supervisor last got it

    def is_repeat(self, sender: Sender | None) -> bool:
        """This sender asked before, and its asking again is the same request."""
        if sender is None or sender.kind == SenderKind.TERMINAL:
            return False
        now = self.clock()
        first = self._first_from.get(sender.key)
        if first is None:
            self._first_from[sender.key] = now
            return False
        return sender.never_escalates or now - first <= BURST_S

    def received(self, sig: int) -> None:
        """The supervisor got ``sig`` from outside (a signal to it, not a key or a viewer)."""
        self._received[sig] = self.clock()

    def explains(self, sig: int | None) -> bool:
        """A rank's death of ``sig`` falls in the burst of the same signal to the supervisor."""
        if sig not in OUTSIDE_STOP_SIGNALS:
            return False
        at = self._received.get(sig)
        return at is not None and abs(self.clock() - at) <= BURST_S
