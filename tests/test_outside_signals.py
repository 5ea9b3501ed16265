"""Signals from outside (SPEC §10), in-process on an injected clock: who sent a repeat decides
whether it is the same request, and a rank's death of the scheduler's own signal is part of
the outside stop. The real inbox (a signalfd, ssi_pid) is proven at the bottom, and with the
whole CLI in tests/test_scheduler_signals.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from policy_harness import INT, KILL, TERM, harness

from forgelm_tui.engine import signal_inbox
from forgelm_tui.engine import supervisor as supervisor_module
from forgelm_tui.engine.records import CancelSource
from forgelm_tui.engine.signal_inbox import SI_KERNEL, SI_USER, Sender, SenderKind, classify
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.verdict import Contract, StopFacts, StopKind, decide

pytestmark = pytest.mark.timeout(30)

SLURMSTEPD = 4242


def sender(pid: int, *, process: str | None = None, code: int = SI_USER,
           parent: int = 1, under_scheduler: bool = False) -> Sender:
    return classify(pid, 0, code, process, parent, under_scheduler)


def cancel(h, who: Sender | None, sig: int = TERM) -> str:  # type: ignore[no-untyped-def]
    return h.policy.cancel(CancelSource.SIGNAL, f"{signal.Signals(sig).name} to the supervisor",
                           sig, who)


@pytest.mark.parametrize("who, kind", [
    (sender(SLURMSTEPD, process="slurmstepd"), SenderKind.SCHEDULER),
    (sender(SLURMSTEPD, parent=SLURMSTEPD, under_scheduler=True), SenderKind.SCHEDULER),
    (sender(SLURMSTEPD, parent=SLURMSTEPD), SenderKind.PROCESS),  # a parent outside SLURM
    (sender(0), SenderKind.OUTSIDE),
    (sender(0, code=SI_KERNEL), SenderKind.TERMINAL),
    (sender(777, process="bash"), SenderKind.PROCESS),
])
def test_senders_are_classified(who: Sender, kind: str) -> None:
    assert who.kind == kind


def test_the_time_limit_burst_from_slurmstepd_is_one_graceful_stop() -> None:
    """SIGTERM, SIGCONT (never a request: not even taken), SIGTERM within 5 ms."""
    h = harness(4, grace=20.0)
    stepd = sender(SLURMSTEPD, process="slurmstepd")
    assert cancel(h, stepd) == "stop"
    h.advance(0.005)
    assert cancel(h, stepd) == "merged"
    h.advance(19.9)
    assert h.effects.signals(KILL) == []
    assert [(c.effect, c.sender) for c in h.policy.cancels] == [("stop", stepd),
                                                                 ("merged", stepd)]


def test_a_repeat_from_the_scheduler_never_escalates_whenever_it_comes() -> None:
    """Preemption with GraceTime: SIGCONT+SIGTERM, then SIGTERM again GraceTime later."""
    h = harness(2, grace=120.0)
    stepd = sender(SLURMSTEPD, parent=SLURMSTEPD, under_scheduler=True)
    assert cancel(h, stepd) == "stop"
    h.advance(60.0)
    assert cancel(h, stepd) == "merged"
    assert h.effects.signals(KILL) == []


def test_signals_from_outside_the_pid_namespace_are_one_sender() -> None:
    h = harness(2, grace=30.0)
    assert cancel(h, sender(0)) == "stop"
    h.advance(10.0)
    assert cancel(h, sender(0)) == "merged"
    assert h.effects.signals(KILL) == []


def test_a_process_burst_is_one_request_and_its_later_repeat_escalates() -> None:
    h = harness(2, grace=30.0)
    shell = sender(777, process="bash")
    assert cancel(h, shell) == "stop"
    h.advance(0.4)
    assert cancel(h, shell) == "merged"
    h.advance(1.0)  # 1.4 s after its first: a person asking again
    assert cancel(h, shell) == "kill"
    assert h.effects.signals(KILL) == [0, 1]


@pytest.mark.parametrize("second", [
    sender(888, process="kill"),  # another process
    sender(0, code=SI_KERNEL),  # a key at the terminal
    None,  # a sender not known (no inbox): as before, a distinct second request
])
def test_a_person_asking_again_still_escalates(second: Sender | None) -> None:
    h = harness(2, grace=30.0)
    first = sender(0, code=SI_KERNEL) if second is not None else None
    assert cancel(h, first or sender(777, process="bash"), INT) == "stop"
    h.advance(0.1)
    assert cancel(h, second) == "kill"
    assert h.effects.signals(KILL) == [0, 1]


def test_the_first_outside_signal_is_merged_with_a_stop_record_of_the_same_cause() -> None:
    """Multi-node: another node's stop from the scheduler's signal came first; this node's own
    copy of that signal adds nothing (unchanged by senders)."""
    h = harness(2, grace=30.0)
    h.policy.note_cause("outside signal")
    h.policy.begin(StopKind.CANCEL, "cancelled by SIGTERM to the supervisor", "SIGTERM", TERM,
                   source=CancelSource.SIGNAL.value)
    assert h.policy.cancel(CancelSource.SIGNAL, "SIGTERM", TERM,
                           sender(SLURMSTEPD, process="slurmstepd")) == "merged"
    # the next one is the supervisor's second: a person's (another sender), an escalation
    assert h.policy.cancel(CancelSource.SIGNAL, "SIGTERM", TERM, sender(4242)) == "kill"


@pytest.mark.fault("F42")
def test_a_rank_killed_by_the_schedulers_sigterm_first_waits_for_the_supervisors_copy() -> None:
    h = harness(3, grace=30.0)
    h.end(1, -TERM)  # slurmstepd reached rank 1 before the supervisor
    assert h.policy.stop is None  # not a failure yet: the burst may reach the supervisor
    h.advance(0.005)
    assert cancel(h, sender(SLURMSTEPD, process="slurmstepd")) == "stop"
    h.advance(1.5)
    assert h.records[1].outside_death and not h.records[1].ending().failed_on_own
    stop = h.policy.stop
    assert stop is not None and stop.kind is StopKind.CANCEL
    h.end(0, -TERM)
    h.end(2, -TERM)
    facts = StopFacts(stop.kind, stop.signal)
    endings = [r.ending() for r in h.records.values()]
    verdict = decide(endings, facts)
    assert (verdict.code, verdict.rule) == (2, 4)
    assert decide(endings, facts, Contract.RAW).code == 143


def test_a_rank_killed_just_after_the_supervisors_copy_is_part_of_the_outside_stop() -> None:
    h = harness(2, grace=30.0)
    h.advance(1.0)
    assert cancel(h, sender(0)) == "stop"
    h.records[1].signals_sent.clear()  # the stop's SIGTERM had not reached it yet
    h.end(1, -TERM)
    assert h.records[1].outside_death


def test_an_outcome_exit_is_never_waited_on() -> None:
    """Rank 0 exits on its own first: the drain window starts at once, as before."""
    h = harness(2, grace=30.0, drain=60.0)
    h.end(0, 0)
    assert "drain" in h.timers.due


def test_a_sigterm_from_nowhere_is_still_a_failure_after_the_burst_window() -> None:
    """A rank killed by SIGTERM that never reached the supervisor: someone killed that rank
    alone. It is a failure, named after the burst window (1 s), the others stopped."""
    h = harness(2, grace=30.0)
    h.end(1, -TERM)
    h.advance(0.99)
    assert h.policy.stop is None
    h.advance(0.02)
    stop = h.policy.stop
    assert stop is not None and stop.kind is StopKind.FAILURE
    assert stop.reason == "rank 1 failed (killed by SIGTERM)"
    assert h.effects.signals(TERM) == [0]
    assert not h.records[1].outside_death


def test_a_different_signal_to_the_supervisor_does_not_explain_a_sigterm_death() -> None:
    h = harness(2, grace=30.0)
    h.end(1, -TERM)
    assert cancel(h, sender(0), INT) == "stop"
    h.advance(1.1)
    assert not h.records[1].outside_death
    assert h.records[1].ending().failed_on_own


def test_a_segfault_is_never_waited_on() -> None:
    h = harness(2, grace=30.0)
    h.end(1, -signal.SIGSEGV)
    assert h.policy.stop is not None and h.policy.stop.kind is StopKind.FAILURE


# ----------------------------------------------------------------------------- the real inbox

INBOX_PROGRAM = textwrap.dedent("""
    import asyncio, os, signal, subprocess, sys, time
    from forgelm_tui.engine import signal_inbox

    assert signal_inbox.start((signal.SIGTERM, signal.SIGUSR1))
    got = []
    async def main():
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        def on_term(sender):
            got.append(sender)
            if not done.done():
                loop.call_later(0.5, done.set_result, None)  # a second one may come, or merge
        loop.add_signal_handler(signal.SIGTERM, on_term, None)  # the ordinary way: no sender
        assert signal_inbox.route(signal.SIGTERM, loop, on_term)
        with signal_inbox.children_unblocked():
            child = subprocess.Popen([sys.executable, "-c",
                "import time; print(open('/proc/self/status').read().split('SigBlk:')[1]"
                ".split()[0], flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
        blocked = child.stdout.readline().strip()
        own = open('/proc/self/status').read().split('SigBlk:')[1].split()[0]
        print("child-blocked", blocked, "own-blocked", own, flush=True)
        print("ready", flush=True)
        await asyncio.wait_for(done, 20)
        child.terminate()
        print("child-ended", child.wait(), flush=True)
        for s in got:
            print("sender", s.pid, s.kind, s.code, flush=True)
        signal_inbox.route(signal.SIGTERM, loop, None)
        loop.remove_signal_handler(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # unrouted: the default disposition ends it
        time.sleep(5)
    asyncio.run(main())
""")


def test_the_inbox_names_the_sender_and_leaves_signals_as_they_were() -> None:
    proc = subprocess.Popen([sys.executable, "-c", INBOX_PROGRAM], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith("ready"):
            break
    os.kill(proc.pid, signal.SIGTERM)
    os.kill(proc.pid, signal.SIGCONT)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    lines += out.splitlines()
    assert proc.returncode == -signal.SIGTERM, (lines, err)
    blocked = lines[0].split()
    assert int(blocked[1], 16) == 0, "the child must start with no signal blocked"
    assert int(blocked[3], 16) & (1 << (signal.SIGTERM - 1)), "the supervisor blocks SIGTERM"
    assert "child-ended -15" in lines, lines  # the child died of SIGTERM
    senders = [line for line in lines if line.startswith("sender")]
    # The kernel merges a pending SIGTERM with the next: one or two arrive, each named.
    assert senders in ([f"sender {os.getpid()} process 0"] * n for n in (1, 2)), lines


UNREAD_PROGRAM = textwrap.dedent("""
    import asyncio, os, signal, time
    from forgelm_tui.engine import signal_inbox

    assert signal_inbox.start((signal.SIGUSR2,))
    async def main():
        loop = asyncio.get_running_loop()
        got = []
        assert signal_inbox.route(signal.SIGUSR2, loop, got.append)
        assert not signal_inbox.unread()
        missed = 0
        for i in range(300):
            os.kill(os.getpid(), signal.SIGUSR2)  # pending (blocked everywhere) on return
            missed += not signal_inbox.unread()
            deadline = time.monotonic() + 10
            while len(got) < i + 1:  # one at a time: never merged with the next
                assert time.monotonic() < deadline, "the signal never reached its route"
                await asyncio.sleep(0.001)
            missed += signal_inbox.unread()  # its callback ran: nothing waits
        print("missed", missed, "got", len(got), {s.pid for s in got}, flush=True)
    asyncio.run(main())
""")


def test_a_signal_sent_before_unread_is_seen_by_it_until_its_callback_ran() -> None:
    """Whether the inbox's thread has read it (posted, not run) or not (still in the
    signalfd: read then): a signal received is never in nobody's hands (the end of a node's
    ranks waits on this before its outcome goes out)."""
    proc = subprocess.Popen([sys.executable, "-c", UNREAD_PROGRAM], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=25)
    assert proc.returncode == 0, err
    assert out.split() == ["missed", "0", "got", "300", f"{{{proc.pid}}}"], out


# ------------------------------------------------- the end of a node's ranks waits for them

QUICK = (sys.executable, "-c", "pass")


def quick_supervisor(tmp_path: Path) -> Supervisor:
    spec = LaunchSpec(argv=QUICK, run_id="r", run_dir=tmp_path, nproc_per_node=2,
                      master_addr="127.0.0.1", master_port=29999, grace=5.0, cwd=tmp_path)
    return Supervisor(spec, base_env={})


async def test_a_signal_received_before_the_ranks_end_is_in_the_nodes_outcome(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's SIGTERM read (posted to the loop) but not acted on yet when its ranks are
    over: the node's outcome goes out (``local_done``) only after its cancel is recorded (the
    agreed envelope lists every node's request; found with the stop alarm, issue 23)."""
    sup = quick_supervisor(tmp_path)
    posted: list[str] = []

    def run_it() -> None:
        posted.append("ran")
        sup.signalled(signal.SIGTERM, None)

    def unread() -> bool:  # the inbox's thread posted SIGTERM just before the ranks ended
        if not posted:
            posted.append("posted")
            asyncio.get_running_loop().call_soon(run_it)
        return posted[-1] != "ran"  # as the inbox: True until its callback ran

    monkeypatch.setattr(signal_inbox, "unread", unread)
    seen: list[list[str]] = []
    sup.hooks.local_done = lambda: seen.append([c.effect for c in sup.cancels])
    await asyncio.wait_for(sup.run(), 30)
    assert seen == [["stop"]]  # after the cancel, once (the ranks had ended: nothing to stop)


async def test_a_flood_of_signals_delays_the_end_a_bounded_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sup = quick_supervisor(tmp_path)
    monkeypatch.setattr(signal_inbox, "unread", lambda: True)  # never settles
    monkeypatch.setattr(supervisor_module, "SIGNALS_WAIT", 0.3)
    done: list[float] = []
    sup.hooks.local_done = lambda: done.append(time.monotonic())
    await asyncio.wait_for(sup.run(), 30)
    last = max(r.ended_mono or 0.0 for r in sup.records.values())
    assert len(done) == 1 and done[0] >= last + 0.3
