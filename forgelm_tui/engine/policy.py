"""The stop policy: when to stop every rank, how long to wait, when to kill. Pure logic.

Driven by facts (a rank ended, a cancel arrived, progress was checked) and by an injected clock
and timers; it acts only through :class:`StopEffects`. No process, loop or signal handler is
touched here, so every rule is tested in-process without a real wait (tests/test_policy.py).

Rules (SPEC §4): a rank that fails on its own, or dies of a forwarded signal, stops every rank
at once; a cancel stops them, and a *distinct* second cancel escalates to SIGKILL (one cause seen
twice is one request); when rank 0 ends with an outcome code the others get the drain window;
with a stall timeout, no progress from any rank for that long stops the run, once every live
rank's stacks are captured (where each was stuck) or the capture's deadline passed, whichever
comes first. A stop is SIGTERM to every live rank in one pass and one shared deadline, the
grace, then SIGKILL.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from forgelm_tui.engine import events as ev
from forgelm_tui.engine import hang
from forgelm_tui.engine.events import Purpose
from forgelm_tui.engine.outside import BURST_S, OUTSIDE_STOP_SIGNALS, OutsideSignals
from forgelm_tui.engine.records import CancelRequest, CancelSource, RankRecord, StopRecord
from forgelm_tui.engine.signal_inbox import Sender
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.signames import signal_name
from forgelm_tui.verdict import StopKind

Clock = Callable[[], float]
HANG_UP = "hang-up"  # the cause of a SIGHUP and of a lost terminal
OUTSIDE_SIGNAL = "outside signal"  # a node's first SIGINT/SIGTERM: maybe sent to every node



def stall_reason(timeout: float) -> str:
    """The stall stop's reason (the policy's, and the record another node gets at once)."""
    return f"stalled: no rank made progress for {timeout:g} s"

class Timers(Protocol):
    def start(self, name: str, delay: float, callback: Callable[[], None]) -> None: ...
    def cancel(self, name: str) -> None: ...


class Peers(Protocol):
    """Ranks on other nodes, as far as this node's policy needs them (SPEC §8)."""

    def live(self) -> bool: ...  # some other node still has ranks running (or is joining)
    def progress_age(self, now: float) -> float | None: ...  # youngest progress among them
    def collective_bounds(self) -> hang.Bounds: ...  # their lowest, highest count per group


class NoPeers:
    """A single-node run."""

    def live(self) -> bool:
        return False

    def progress_age(self, now: float) -> float | None:
        return None

    def collective_bounds(self) -> hang.Bounds:
        return {}


class StopEffects(Protocol):
    """What the policy asks of the engine."""

    def signal_ranks(self, ranks: Sequence[RankRecord], sig: int, purpose: Purpose,
                     reason: str) -> Sequence[RankRecord]: ...
    def rank_changed(self, record: RankRecord) -> None: ...
    def emit(self, event: ev.Event) -> None: ...
    def capture_stacks(self, ranks: Sequence[RankRecord], reason: str,
                       done: Callable[[], None]) -> None: ...  # ``done`` once captured


@dataclass(frozen=True)
class PolicySettings:
    grace: float = 30.0
    drain: float = 60.0
    stall_timeout: float | None = None
    quiet_after: float = 10.0
    node_rank: int = 0
    stacks_deadline: float = 2.0  # a stall stop waits at most this long for the stacks


class StopPolicy:
    def __init__(self, records: Mapping[int, RankRecord], settings: PolicySettings,
                 effects: StopEffects, timers: Timers, clock: Clock = time.monotonic,
                 wall: Clock = time.time, peers: Peers | None = None) -> None:
        self.records = records
        self.settings = settings
        self.effects = effects
        self.timers = timers
        self.clock = clock
        self.wall = wall
        self.peers: Peers = peers or NoPeers()
        self.stop: StopRecord | None = None
        self.cancels: list[CancelRequest] = []
        self._causes: set[str] = set()
        self._after_stacks: dict[str, Any] | None = None  # the stop that waits for the stacks
        self._stacks_began = 0.0
        self.outside = OutsideSignals(clock)
        self._signalled = False  # a stop signal reached this supervisor
        self._unexplained: list[RankRecord] = []  # killed by SIGTERM-like, no outside copy yet

    def live(self) -> list[RankRecord]:
        return [r for r in self.records.values() if r.alive]

    def stopping_event(self) -> ev.RunStopping | None:
        """The stop under way, as a view that comes late is told it (a snapshot)."""
        stop = self.stop
        if stop is None:
            return None
        live = tuple(r.rank for r in self.live())
        return ev.RunStopping(stop.kind, stop.reason, stop.origin, stop.grace, live, stop.at)

    # ------------------------------------------------------------------ facts

    def rank_ended(self, record: RankRecord) -> None:
        if self._outside_death(record):
            return
        if self.stop is not None:
            return
        if record.forwarded_death and record.signal is not None:
            name = signal_name(record.signal)
            self.begin(StopKind.FORWARDED, f"rank {record.rank} ended on {name}, forwarded by "
                       "forgelm-tui", "forwarded signal", record.signal)
        elif record.ending().failed_on_own:
            self._failed(record)
        elif record.rank == 0 and (self.live() or self.peers.live()):
            self.timers.start("drain", self.settings.drain, self._drain_ended)

    def _failed(self, record: RankRecord) -> None:
        how = (f"killed by {signal_name(record.signal)}" if record.signal is not None
               else f"exit {record.exit_code}")
        self.begin(StopKind.FAILURE, f"rank {record.rank} failed ({how})", "failure",
                   origin_rank=record.rank)

    def _outside_death(self, record: RankRecord) -> bool:
        """A death of a stop signal forgelm-tui did not send: the scheduler's, if the supervisor
        got the same from outside within the burst (now, or within BURST_S from now)."""
        if (record.signal not in OUTSIDE_STOP_SIGNALS or record.signalled_first
                or record.forwarded_death):
            return False
        from_outside = self.stop is not None and self.stop.source == CancelSource.SIGNAL.value
        if from_outside or self.outside.explains(record.signal):
            record.outside_death = True  # ...and the stop that signal began covers it
            return True
        self._unexplained.append(record)
        self.timers.start("outside", BURST_S, self._no_outside_copy)
        return True

    def _no_outside_copy(self) -> None:
        """No outside signal explained these deaths: they failed on their own."""
        pending, self._unexplained = self._unexplained, []
        for record in pending:
            if self.stop is None:
                self._failed(record)

    def _explain(self, sig: int) -> None:
        """The supervisor got ``sig`` from outside: deaths of it just before were the same."""
        self.outside.received(sig)
        explained = [r for r in self._unexplained if r.signal == sig]
        self._unexplained = [r for r in self._unexplained if r.signal != sig]
        for record in explained:
            record.outside_death = True
        if not self._unexplained:
            self.timers.cancel("outside")

    def launch_failed(self, message: str) -> None:
        self.begin(StopKind.FAILURE, message, "launch")

    def progress_checked(self, now: float) -> None:
        """After a sample pass: mark quiet ranks, tell views what kind of progress counts for
        each rank (``RankRecord.saw`` decides), and stop a run in which none progresses."""
        timeout = self.settings.stall_timeout
        quiet_after = min(self.settings.quiet_after, timeout or float("inf"))
        live = self.live()
        if self.stop is None and self._after_stacks is None:  # the counts a stall froze stay
            found = hang.merge([hang.bounds(live), self.peers.collective_bounds()])
            hang.mark_gaps(live, found, now)
        for record in live:
            quiet = record.progress_age(now) >= quiet_after
            if quiet != record.quiet:
                record.quiet = quiet
                self.effects.rank_changed(record)
            if record.progress_evidence is not record.evidence_told:
                record.evidence_told = record.progress_evidence
                self.effects.emit(ev.RankEvidenceChanged(record.rank, record.progress_evidence))
        if timeout is None or self.stop is not None or not live:
            return
        ages = [r.progress_age(now) for r in live]
        peer_age = self.peers.progress_age(now)  # a rank on another node progressing: no stall
        if min(ages + ([] if peer_age is None else [peer_age])) < timeout:
            return
        if self._after_stacks is not None:
            return  # declared already: its stacks are being captured
        self.effects.emit(ev.RunStalled(timeout, tuple(r.rank for r in live)))
        self.stop_after_stacks(StopKind.STALL, stall_reason(timeout), "stall")

    # ------------------------------------------------------------------ commands

    def cancel(self, source: CancelSource, origin: str, sig: int,
               sender: Sender | None = None) -> str:
        """A cancel request; returns its effect: "stop", "kill" or "merged".

        What the request stands for, its cause (``_cause``): a cause already seen adds nothing,
        so one cause is never an escalation; and a hang-up is never an escalation at all (a
        closed terminal is not a person asking again). ``sender``: who sent the signal
        (engine/signal_inbox.py); a repeat from the scheduler, or a burst from one process, is
        the same request (engine/outside.py).
        """
        cause = self._cause(source, sig)
        if source is CancelSource.SIGNAL:
            self._explain(sig)
        repeat = self.outside.is_repeat(sender)
        if repeat or (cause is not None and cause in self._causes):
            effect = "merged"
        elif self.stop is None:
            effect = "stop"
        else:  # a hang-up is nobody asking: it never escalates a stop already under way
            effect = "merged" if cause == HANG_UP else "kill"
        if cause is not None:
            self._causes.add(cause)
        self.cancels.append(CancelRequest(source, origin, sig, self.wall(), effect, sender))
        if effect == "stop":
            self.begin(StopKind.CANCEL, f"cancelled by {origin}", origin, sig,
                       source=source.value)
        elif effect == "kill":
            self.escalate(f"second cancel by {origin}: kill now")
        return effect

    def _cause(self, source: CancelSource, sig: int) -> str | None:
        """What a cancel stands for: SIGHUP and a closed terminal are one hang-up, whoever
        reports it; the first stop signal to the supervisor may be one a scheduler sent every
        node (another node's stop record may have brought that cause already)."""
        if sig == signal.SIGHUP:
            return HANG_UP
        if source is not CancelSource.SIGNAL:
            return None
        first, self._signalled = not self._signalled, True
        return OUTSIDE_SIGNAL if first else None

    def note_cause(self, cause: str) -> None:
        """A cause already acted on elsewhere (another node): seeing it here adds nothing."""
        self._causes.add(cause)

    def kill_now(self, source: CancelSource, origin: str) -> None:
        """SIGKILL every live rank now (starting a stop first when none is under way)."""
        if self.stop is None:
            self.cancels.append(CancelRequest(source, origin, signal.SIGKILL, self.wall(), "kill"))
            self.begin(StopKind.CANCEL, f"killed by {origin}", origin, signal.SIGKILL,
                       source=source.value)
        self.escalate(f"kill now by {origin}")

    def escalate(self, reason: str) -> None:
        """A person's kill: SIGKILL now, and tell every view (and other nodes) so."""
        self.kill_pass(reason)
        self.effects.emit(ev.RunEscalated(reason, self.wall()))

    # ------------------------------------------------------------------ the stop

    def begin(self, kind: StopKind, reason: str, origin: str, sig: int | None = None, *,
              grace: float | None = None, origin_rank: int | None = None,
              origin_node: int | None = None, lost_node: int | None = None,
              source: str | None = None, stacks_delay: float | None = None) -> None:
        """Stop every live rank: SIGTERM in one pass, SIGKILL at the grace deadline. Another
        node's stop record arrives here too, with its grace and origin (SPEC §8)."""
        if self.stop is not None:
            return
        grace = self.settings.grace if grace is None else grace
        node = self.settings.node_rank if origin_node is None else origin_node
        self.stop = StopRecord(kind, reason, origin, sig, self.wall(), self.clock() + grace,
                               grace=grace, origin_rank=origin_rank, origin_node=node,
                               lost_node=lost_node, source=source, stacks_delay=stacks_delay)
        self.timers.cancel("drain")
        live = self.live()
        self.effects.signal_ranks(live, signal.SIGTERM, Purpose.STOP, reason)
        self.effects.emit(ev.RunStopping(kind, reason, origin, grace,
                                         tuple(r.rank for r in live), self.stop.at))
        if live:
            self.timers.start("kill", grace, lambda: self.kill_pass(f"grace of {grace:g} s ended"))
            self.timers.start("countdown", 1.0, self._countdown)

    def extend_grace(self, grace: float, why: str) -> bool:
        """The stop under way gets a longer grace (the scheduler's window, found longer once the
        stop's cause is known: a preemption's GraceTime). The SIGKILL pass moves later, never
        earlier, and not once it has run. True if it moved."""
        stop = self.stop
        if stop is None or stop.killed_at is not None or grace <= stop.grace:
            return False
        stop.deadline_mono += grace - stop.grace
        stop.grace, stop.grace_from = grace, why
        if self.live():
            self.timers.start("kill", max(0.0, stop.deadline_mono - self.clock()),
                              lambda: self.kill_pass(f"grace of {grace:g} s ended ({why})"))
        self.effects.emit(ev.GraceExtended(grace, why, self.wall()))
        return True

    def apply_stop(self, stop: StopRecord) -> None:
        """Another node's stop record (SPEC §8): this node's ranks stop the same way, with the
        record's grace and origin; after a stall, once this node's stacks are in too."""
        how: dict[str, Any] = {"sig": stop.signal, "grace": stop.grace,
                               "origin_rank": stop.origin_rank, "source": stop.source,
                               "origin_node": stop.origin_node, "lost_node": stop.lost_node}
        if stop.kind is StopKind.STALL:
            self.stop_after_stacks(stop.kind, stop.reason, stop.origin, **how)
        else:
            self.begin(stop.kind, stop.reason, stop.origin, **how)

    def stop_after_stacks(self, kind: StopKind, reason: str, origin: str,
                          **begin: Any) -> None:
        """A stall: first every live rank's stacks (where each is stuck), then the stop, as
        :meth:`begin` makes it. The capture runs outside (``capture_stacks``); the stop begins
        when it is done or at ``stacks_deadline``, whichever is first. Another node's stall
        record arriving meanwhile replaces this one (it is the agreed one) and waits too."""
        if self.stop is not None:
            return
        pending = self._after_stacks
        self._after_stacks = {"kind": kind, "reason": reason, "origin": origin, **begin}
        if pending is not None:
            return  # a capture is under way: this stop waits for it
        # The ranks that never entered a collective others wait in first: theirs is the stack
        # that says why (engine/hang.py). Every live rank is stalled, here or on another node.
        live = sorted(self.live(), key=lambda r: not r.behind)
        for record in live:
            record.stalled = True
        self._stacks_began = self.clock()
        if not live or self.settings.stacks_deadline <= 0:
            self._stacks_done()
            return
        self.timers.start("stacks", self.settings.stacks_deadline, self._stacks_done)
        self.effects.capture_stacks(live, kind.value, self._stacks_done)

    def _stacks_done(self) -> None:
        self.timers.cancel("stacks")
        pending, self._after_stacks = self._after_stacks, None
        if pending is not None:
            self.begin(**pending, stacks_delay=self.clock() - self._stacks_began)

    def kill_pass(self, reason: str) -> None:
        self.timers.cancel("kill")
        live = self.live()
        if self.stop is not None and self.stop.killed_at is None and live:
            self.stop.killed_at = self.wall()
        self.effects.signal_ranks(live, signal.SIGKILL, Purpose.KILL, reason)

    def seconds_left(self) -> float | None:
        if self.stop is None:
            return None
        return max(0.0, self.stop.deadline_mono - self.clock())

    def _drain_ended(self) -> None:
        if (self.live() or self.peers.live()) and self.stop is None:
            reason = f"drain window of {self.settings.drain:g} s ended after rank 0 finished"
            self.begin(StopKind.DRAIN, reason, "drain")

    def _countdown(self) -> None:
        live = self.live()
        left = self.seconds_left()
        if not live or left is None:
            return
        self.effects.emit(ev.StopCountdown(left, tuple(r.rank for r in live)))
        self.timers.start("countdown", 1.0, self._countdown)


def settings_for(spec: LaunchSpec) -> PolicySettings:
    return PolicySettings(grace=spec.grace, drain=spec.drain, stall_timeout=spec.stall_timeout,
                          quiet_after=spec.quiet_after, node_rank=spec.node_rank,
                          stacks_deadline=spec.stacks_deadline)
