"""Signals to forward that came before the ranks could take them (issue 20, point 4).

A scheduler's early warning (``sbatch --signal=USR1@N``) can fire while the nodes are still
joining, before any rank exists: forwarded then it reached no one and was lost. It is held, and
given to each rank once that rank has a handler for it (its ``SigCgt``/``SigIgn`` in /proc, read
by the sampler every tick): passed on at the rank's start, it would kill a program that had not
yet installed its handler (the default action of SIGUSR1 is to terminate). A rank that never
installs one never gets it; the envelope says which ranks it reached and since when it was held.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from forgelm_tui.engine.events import Purpose
from forgelm_tui.engine.records import ForwardRequest, RankRecord
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
