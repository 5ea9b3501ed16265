"""An in-process harness for the stop policy: records without processes, a clock and timers
under the test's hand, effects that only record what the policy asked for."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from conftest import FakeClock, rank_record

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import Purpose, SignalSent
from forgelm_tui.engine.policy import PolicySettings, StopPolicy
from forgelm_tui.engine.records import RankRecord


class FakeTimers:
    """Named one-shot timers on a fake clock; :meth:`advance` fires what falls due, in order."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.due: dict[str, tuple[float, Callable[[], None]]] = {}

    def start(self, name: str, delay: float, callback: Callable[[], None]) -> None:
        self.due[name] = (self.clock.now + delay, callback)

    def cancel(self, name: str) -> None:
        self.due.pop(name, None)

    def advance(self, seconds: float) -> None:
        target = self.clock.now + seconds
        while self.due:
            name, (when, callback) = min(self.due.items(), key=lambda item: item[1][0])
            if when > target:
                break
            del self.due[name]
            self.clock.now = when
            callback()
        self.clock.now = target


@dataclass
class Effects:
    sent: list[tuple[int, int, Purpose, str, float]] = field(default_factory=list)
    events: list[ev.Event] = field(default_factory=list)
    clock: FakeClock | None = None
    hold_stacks: bool = False  # keep capture requests pending (else each is done at once)
    captures: list[tuple[tuple[int, ...], str, Callable[[], None]]] = field(default_factory=list)

    def signal_ranks(self, ranks: Sequence[RankRecord], sig: int, purpose: Purpose,
                     reason: str) -> Sequence[RankRecord]:
        now = self.clock.now if self.clock else 0.0
        for record in ranks:
            record.signals_sent.append(SignalSent(sig, now, reason, purpose))
            self.sent.append((record.rank, sig, purpose, reason, now))
        return ranks

    def rank_changed(self, record: RankRecord) -> None:
        self.events.append(ev.RankStateChanged(record.rank, record.state))

    def emit(self, event: ev.Event) -> None:
        self.events.append(event)

    def capture_stacks(self, ranks: Sequence[RankRecord], reason: str,
                       done: Callable[[], None]) -> None:
        self.captures.append((tuple(r.rank for r in ranks), reason, done))
        if not self.hold_stacks:
            done()

    def signals(self, sig: int) -> list[int]:
        return [rank for rank, s, *_ in self.sent if s == sig]

    def of(self, kind: type) -> list[ev.Event]:
        return [e for e in self.events if isinstance(e, kind)]


@dataclass
class Harness:
    policy: StopPolicy
    records: dict[int, RankRecord]
    clock: FakeClock
    timers: FakeTimers
    effects: Effects

    def end(self, rank: int, returncode: int) -> None:
        """A rank ends (code, or -signal), as the engine reports it to the policy."""
        record = self.records[rank]
        record.mark_exit(returncode)
        record.ended_mono = self.clock.now
        self.policy.rank_ended(record)

    def progress(self, rank: int) -> None:
        self.records[rank].last_progress_mono = self.clock.now

    def advance(self, seconds: float) -> None:
        self.timers.advance(seconds)


def harness(world: int = 2, **settings: float | None) -> Harness:
    clock = FakeClock()
    timers = FakeTimers(clock)
    effects = Effects(clock=clock)
    records = {}
    for rank in range(world):
        record = rank_record(rank, pid=1000 + rank)
        record.started_mono = record.last_progress_mono = clock.now
        records[rank] = record
    policy = StopPolicy(records, PolicySettings(**settings), effects, timers,  # type: ignore[arg-type]
                        clock=clock, wall=clock)
    return Harness(policy, records, clock, timers, effects)


TERM, KILL, INT, HUP = signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP
