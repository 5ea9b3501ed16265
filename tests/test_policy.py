"""The stop policy in-process: fail fast, grace, escalation, one cause = one request, drain,
stall, forwarded signals. No process and no real wait: an injected clock and timers."""

from __future__ import annotations

import pytest
from policy_harness import HUP, INT, KILL, TERM, harness

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import Purpose, RankState
from forgelm_tui.engine.records import CancelSource
from forgelm_tui.verdict import Contract, StopFacts, StopKind, decide

pytestmark = pytest.mark.timeout(10)


def test_a_failure_stops_every_live_rank_in_one_pass_then_kills_at_the_grace() -> None:
    h = harness(4, grace=30.0)
    h.end(2, 7)
    assert h.policy.stop is not None and h.policy.stop.kind is StopKind.FAILURE
    assert h.policy.stop.reason == "rank 2 failed (exit 7)"
    assert h.effects.signals(TERM) == [0, 1, 3]
    assert {at for *_, at in h.effects.sent} == {100.0}  # one pass, one moment
    stopping = h.effects.of(ev.RunStopping)
    assert [(e.kind, e.grace, e.live_ranks) for e in stopping] == [(StopKind.FAILURE, 30.0,
                                                                      (0, 1, 3))]
    h.end(0, -TERM)
    h.end(1, 0)
    h.advance(29.99)
    assert h.effects.signals(KILL) == []
    h.advance(0.02)
    assert h.effects.signals(KILL) == [3]  # only what is still alive, at the deadline
    assert h.policy.stop.killed_at == pytest.approx(130.0)
    assert [r.state for r in h.records.values()] == [
        RankState.KILLED, RankState.EXITED, RankState.FAILED, RankState.STOPPING]


def test_the_failure_path_honours_the_grace_too() -> None:
    h = harness(2, grace=3.0)
    h.end(1, -KILL)  # an OOM kill: a signal nobody here sent
    assert "killed by SIGKILL" in h.policy.stop.reason  # type: ignore[union-attr]
    h.advance(2.9)
    assert h.effects.signals(KILL) == []
    h.advance(0.2)
    assert h.effects.signals(KILL) == [0]


def test_a_real_time_signal_is_named_and_stops_the_run() -> None:
    h = harness(2)
    h.end(1, -40)
    assert h.policy.stop is not None
    assert h.policy.stop.reason == "rank 1 failed (killed by SIGRTMIN+6)"
    assert h.effects.signals(TERM) == [0]


def test_a_second_distinct_cancel_kills_at_once() -> None:
    h = harness(2, grace=30.0)
    assert h.policy.cancel(CancelSource.OPERATOR, "operator", INT) == "stop"
    h.advance(1.0)
    assert h.effects.signals(KILL) == []
    assert h.policy.cancel(CancelSource.SIGNAL, "SIGTERM to the supervisor", TERM) == "kill"
    assert h.effects.signals(KILL) == [0, 1]
    assert h.policy.stop is not None and h.policy.stop.signal == INT  # the first one's signal
    assert [(c.source, c.effect) for c in h.policy.cancels] == [
        (CancelSource.OPERATOR, "stop"), (CancelSource.SIGNAL, "kill")]


def test_one_cause_seen_twice_is_one_graceful_stop() -> None:
    """SIGHUP then the lost terminal check: the full grace, no SIGKILL before it."""
    h = harness(2, grace=30.0)
    h.policy.cancel(CancelSource.SIGNAL, "SIGHUP to the supervisor", HUP)
    h.advance(0.26)
    effect = h.policy.cancel(CancelSource.TERMINAL, "terminal closed", HUP)
    assert effect == "merged"
    h.advance(29.0)
    assert h.effects.signals(KILL) == []
    assert [c.effect for c in h.policy.cancels] == ["stop", "merged"]
    # ...but a distinct request after it still escalates.
    assert h.policy.cancel(CancelSource.OPERATOR, "operator", INT) == "kill"
    assert h.effects.signals(KILL) == [0, 1]


def test_a_hang_up_never_escalates_a_stop_under_way() -> None:
    """A scheduler's SIGTERM, then the terminal closes (or a SIGHUP): still one graceful stop."""
    h = harness(2, grace=30.0)
    h.policy.cancel(CancelSource.SIGNAL, "SIGTERM to the supervisor", TERM)
    h.advance(0.5)
    assert h.policy.cancel(CancelSource.TERMINAL, "terminal closed", HUP) == "merged"
    assert h.policy.cancel(CancelSource.SIGNAL, "SIGHUP to the supervisor", HUP) == "merged"
    h.advance(29.0)
    assert h.effects.signals(KILL) == []


def test_the_cancel_is_on_record_before_the_stop_is_announced() -> None:
    """The provisional envelope is written on RunStopping: it must already name the cancel."""
    h = harness(2)
    seen: list[int] = []
    emit = h.effects.emit

    def spy(event: ev.Event) -> None:
        if isinstance(event, ev.RunStopping):
            seen.append(len(h.policy.cancels))
        emit(event)

    h.effects.emit = spy  # type: ignore[method-assign]
    h.policy.cancel(CancelSource.OPERATOR, "operator", INT)
    assert seen == [1]


def test_kill_now_starts_a_stop_and_kills() -> None:
    h = harness(3)
    h.policy.kill_now(CancelSource.OPERATOR, "operator")
    assert h.policy.stop is not None and h.policy.stop.signal == KILL
    assert h.effects.signals(TERM) == [0, 1, 2] and h.effects.signals(KILL) == [0, 1, 2]
    assert h.policy.cancels[0].effect == "kill"


def test_rank0_outcome_gives_the_others_the_drain_window() -> None:
    h = harness(3, drain=60.0, grace=5.0)
    h.end(0, 4)
    assert h.policy.stop is None
    h.advance(59.0)
    h.end(1, 0)  # finished on its own within the window
    assert h.effects.sent == []
    h.advance(1.5)
    assert h.policy.stop is not None and h.policy.stop.kind is StopKind.DRAIN
    assert h.effects.signals(TERM) == [2]
    h.end(2, -TERM)
    decided = decide([r.ending() for r in h.records.values()], StopFacts(StopKind.DRAIN))
    assert (decided.code, decided.rule) == (4, 3)  # rank 0's code stands


def test_drain_ends_quietly_when_every_rank_is_done() -> None:
    h = harness(2, drain=10.0)
    h.end(0, 0)
    h.end(1, 0)
    h.advance(20.0)
    assert h.policy.stop is None and h.effects.sent == []


def test_an_outcome_on_another_rank_stops_nothing() -> None:
    h = harness(2, drain=1.0)
    h.end(1, 4)
    h.advance(5.0)
    assert h.policy.stop is None and h.effects.sent == []


def test_a_stop_cancels_the_drain() -> None:
    h = harness(3, drain=10.0, grace=30.0)
    h.end(0, 0)
    h.policy.cancel(CancelSource.OPERATOR, "operator", INT)
    h.advance(15.0)
    assert h.policy.stop is not None and h.policy.stop.kind is StopKind.CANCEL
    assert len(h.effects.of(ev.RunStopping)) == 1


def test_no_progress_from_any_rank_is_a_stall() -> None:
    h = harness(2, stall_timeout=5.0, grace=2.0)
    h.advance(4.0)
    h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is None
    assert [r.state for r in h.records.values()] == [RankState.RUNNING] * 2
    h.advance(1.0)
    h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is not None and h.policy.stop.kind is StopKind.STALL
    assert h.policy.stop.reason == "stalled: no rank made progress for 5 s"
    assert [e.ranks for e in h.effects.of(ev.RunStalled)] == [(0, 1)]
    assert all(r.stalled for r in h.records.values())
    for rank in (0, 1):
        h.end(rank, -TERM)
    decided = decide([r.ending() for r in h.records.values()], StopFacts(StopKind.STALL),
                     Contract.RAW)
    assert (decided.code, decided.rule) == (2, 4)


def test_one_quiet_rank_is_only_marked() -> None:
    h = harness(2, stall_timeout=5.0, quiet_after=10.0)
    for _ in range(20):
        h.advance(1.0)
        h.progress(0)  # rank 0 evaluates and prints; rank 1 idles at a barrier
        h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is None
    assert h.records[1].state is RankState.QUIET  # quiet after min(quiet_after, stall timeout)
    assert h.records[0].state is RankState.RUNNING
    changes = [e for e in h.effects.of(ev.RankStateChanged) if e.rank == 1]
    assert changes == [ev.RankStateChanged(1, RankState.QUIET)]  # told once
    h.progress(1)
    h.policy.progress_checked(h.clock.now)
    assert h.records[1].state is RankState.RUNNING


def test_heartbeats_keep_a_silent_run_from_stalling() -> None:
    h = harness(2, stall_timeout=2.0)
    for _ in range(10):
        h.advance(1.0)
        h.progress(1)  # a heartbeat is progress
        h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is None


def test_no_stall_check_without_a_timeout() -> None:
    h = harness(2)
    h.advance(3600.0)
    h.policy.progress_checked(h.clock.now)
    assert h.policy.stop is None
    assert all(r.state is RankState.QUIET for r in h.records.values())


def test_a_rank_ended_by_a_forwarded_signal_interrupts_the_run() -> None:
    h = harness(2, grace=30.0)
    rank0 = h.records[0]
    h.effects.signal_ranks([rank0], 10, Purpose.FORWARD, "SIGUSR1 forwarded from the supervisor")
    h.end(0, -10)
    assert rank0.forwarded_death and not rank0.ending().failed_on_own
    stop = h.policy.stop
    assert stop is not None and (stop.kind, stop.signal) == (StopKind.FORWARDED, 10)
    assert stop.reason == "rank 0 ended on SIGUSR1, forwarded by forgelm-tui"
    assert h.effects.signals(TERM) == [1]  # the peer would hang in the next collective
    h.end(1, -TERM)
    facts = StopFacts(stop.kind, stop.signal)
    endings = [r.ending() for r in h.records.values()]
    assert (decide(endings, facts).code, decide(endings, facts).rule) == (2, 4)
    assert decide(endings, facts, Contract.RAW).code == 138


def test_countdown_names_only_live_ranks_and_stops_with_them() -> None:
    h = harness(3, grace=10.0)
    h.policy.cancel(CancelSource.OPERATOR, "operator", INT)
    h.advance(1.0)
    h.end(0, -TERM)
    h.advance(1.0)
    h.end(1, -TERM)
    h.advance(1.0)
    countdowns = h.effects.of(ev.StopCountdown)
    assert [(round(c.seconds_left), c.live_ranks) for c in countdowns] == [
        (9, (0, 1, 2)), (8, (1, 2)), (7, (2,))]
    h.end(2, 0)
    h.advance(10.0)
    assert len(h.effects.of(ev.StopCountdown)) == 3
    assert h.effects.signals(KILL) == []  # nothing left to kill at the deadline


def test_a_longer_scheduler_window_moves_the_kill_later_never_earlier() -> None:
    """A preemption found during the stop (GraceTime + KillWait, not KillWait alone): the
    SIGKILL pass moves to the longer grace, measured from the stop's start; a shorter one, or
    one after the kill, changes nothing (policy.extend_grace)."""
    h = harness(2, grace=5.0)
    h.policy.cancel(CancelSource.SIGNAL, "SIGTERM to the supervisor", TERM)
    h.advance(2.0)
    assert not h.policy.extend_grace(4.0, "shorter")
    assert h.policy.extend_grace(10.0, "preempted: GraceTime 5 s + SLURM KillWait 10 s, less 5 s")
    assert h.policy.seconds_left() == pytest.approx(8.0)
    (grown,) = h.effects.of(ev.GraceExtended)  # every view is told (headless, TUI)
    assert isinstance(grown, ev.GraceExtended) and grown.grace == 10.0
    h.advance(7.9)
    assert h.effects.signals(KILL) == []
    h.advance(0.2)
    assert h.effects.signals(KILL) == [0, 1]
    stop = h.policy.stop
    assert stop is not None and stop.grace == 10.0 and stop.killed_at == pytest.approx(110.0)
    assert stop.grace_from is not None and stop.grace_from.startswith("preempted: GraceTime 5 s")
    assert h.effects.sent[-1][3] == f"grace of 10 s ended ({stop.grace_from})"
    assert not h.policy.extend_grace(20.0, "after the kill")
    assert stop.grace == 10.0
