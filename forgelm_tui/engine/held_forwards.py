"""Signals to forward, and those that came before the ranks could take them (issue 20).

A scheduler's early warning (``sbatch --signal=USR1@N``, which SLURM may send up to 60 s
early) can fire while the nodes are still joining, before any rank exists, or while the ranks
are starting and have not installed their handler yet (Lightning's comes with ``fit``, minutes
after the start): passed on then it would kill them (the default action of SIGUSR1 is to
terminate). So a signal from the scheduler (or from outside the PID namespace) is given to each
rank once that rank has a handler for it (its ``SigCgt``/``SigIgn`` in /proc: read at once, then
by the sampler every tick), and held for the others; before any rank exists it is held for all.
A rank that never installs one never gets it; the envelope says which ranks it reached and since
when it was held. A forward from anyone else (an operator's key, a viewer, a script's kill) goes
to every live rank at once, as always: a rank with no handler dies of it (a forwarded death).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from forgelm_tui.engine.events import Purpose
from forgelm_tui.engine.records import ForwardRequest, RankRecord
from forgelm_tui.engine.sampler import signal_masks
from forgelm_tui.signames import handles, signal_name

# the supervisor's: signal these ranks, for this purpose and reason; who got it
SignalRanks = Callable[[Sequence[RankRecord], int, Purpose, str], Sequence[RankRecord]]


@dataclass
class _Held:
    request: ForwardRequest
    waiting: set[int] = field(default_factory=set)  # ranks still to get it
    reached: list[int] = field(default_factory=list)
    released: bool = False


class HeldForwards:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._held: list[_Held] = []

    def __bool__(self) -> bool:
        return bool(self._held)

    def hold(self, request: ForwardRequest) -> None:
        self._held.append(_Held(request))

    def forward(self, request: ForwardRequest, launched: bool, live: Sequence[RankRecord],
                signal_ranks: SignalRanks, reaches_ranks: bool) -> ForwardRequest | None:
        """Pass ``request`` on (Supervisor.forward): the request as done, or None while it is
        held for some rank. ``reaches_ranks``: the scheduler's own signals reach the ranks
        (proctrack/linuxproc): one it sent is recorded, not sent again."""
        scheduler = request.sender is not None and request.sender.never_escalates
        if not launched:
            self.hold(request)
            return None
        sig, reason = request.signal, f"{signal_name(request.signal)} forwarded from the supervisor"
        if scheduler and reaches_ranks:
            return replace(request, ranks=tuple(r.rank for r in live), by_scheduler=True)
        if not scheduler:
            sent = signal_ranks(live, sig, Purpose.FORWARD, reason)
            return replace(request, at=self._clock(), ranks=tuple(r.rank for r in sent))
        ready = [r for r in live if r.pid is not None and handles(*signal_masks(r.pid), sig)]
        sent = signal_ranks(ready, sig, Purpose.FORWARD, reason)
        waiting = {r.rank for r in live} - {r.rank for r in sent}
        if not waiting:
            return replace(request, at=self._clock(), ranks=tuple(r.rank for r in sent))
        self._held.append(_Held(request, waiting, [r.rank for r in sent], released=True))
        return None

    def release(self, ranks: Iterable[int]) -> None:
        """The ranks have started: each held signal now waits for these ranks' handlers."""
        started = set(ranks)
        for held in self._held:
            if not held.released:
                held.waiting, held.released = set(started), True

    def deliver(self, records: Iterable[RankRecord],
                signal_ranks: SignalRanks) -> list[ForwardRequest]:
        """Give each held signal to every live rank that now handles it (or ignores it); the
        requests that have reached every rank they wait for, done."""
        if not self._held:
            return []
        live = {r.rank: r for r in records if r.alive}
        done = []
        for held in self._held:
            if not held.released:
                continue
            sig = held.request.signal
            reason = f"{signal_name(sig)} forwarded from the supervisor (held until the rank " \
                     "handled it)"
            for rank in sorted(held.waiting):
                record = live.get(rank)
                if record is None:
                    held.waiting.discard(rank)  # ended before it could take it
                elif handles(record.caught_mask, record.ignored_mask, sig) and \
                        signal_ranks([record], sig, Purpose.FORWARD, reason):
                    held.waiting.discard(rank)
                    held.reached.append(rank)
            if not held.waiting:
                done.append(self._record(held))
        self._held = [h for h in self._held if h.waiting or not h.released]
        return done

    def close(self) -> list[ForwardRequest]:
        """The run is over: what is still held, as far as it got (maybe no rank at all)."""
        left, self._held = self._held, []
        return [self._record(held) for held in left]

    def _record(self, held: _Held) -> ForwardRequest:
        request = held.request
        return replace(request, at=self._clock(), ranks=tuple(sorted(held.reached)),
                       held_since=request.at)
