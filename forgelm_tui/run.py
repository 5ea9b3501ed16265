"""One run from plan to exit code: engine + view + verdict + envelope, on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forgelm_tui import envelope as env_mod
from forgelm_tui.attempts import AttemptChain, attempt_entry, attempt_facts, make_attempt_dir
from forgelm_tui.control.server import serving
from forgelm_tui.ending import RunEnding
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.crash import note_crashes
from forgelm_tui.engine.faults import fault_verdict
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.own_signals import OwnSignals
from forgelm_tui.engine.records import CancelRequest, CancelSource
from forgelm_tui.engine.restart_policy import RestartDecision, backoff, decide_restart
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.forgelm_mode import extract_result
from forgelm_tui.headless import HeadlessView, OutputSink, ending_notes
from forgelm_tui.internal_error import report_internal_error
from forgelm_tui.plan import Plan, RunInfo
from forgelm_tui.redact import redact_argv, redact_text
from forgelm_tui.signames import signal_name
from forgelm_tui.storage import not_kept_line
from forgelm_tui.verdict import RankEnding, StopFacts, Verdict, decide, prelaunch_failure

if TYPE_CHECKING:
    from forgelm_tui.cluster.node import NodeRun


class RunReport:
    """Builds and writes the envelope; provisional at the start of a stop, final at the end."""

    def __init__(self, plan: Plan, supervisor: Supervisor) -> None:
        self.plan = plan
        self.supervisor = supervisor  # the attempt under way (one unless --max-restarts)
        self.ending: RunEnding | None = None
        self.attempts: list[dict[str, Any]] = []  # the envelope's entries of ended attempts
        self.started_at: float | None = None  # the first attempt's start: the run's
        self.backoff_cancel: CancelRequest | None = None  # a cancel between two attempts

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunStopping):
            self._write(self._build(provisional=True))

    def verdict(self) -> Verdict:
        sup = self.supervisor
        if sup.launch_error is not None:
            return prelaunch_failure()
        error = sup.faults.error
        if error is not None and error.ranks_running:
            return fault_verdict(error)  # forgelm-tui itself failed while ranks ran: 2
        stop = sup.stop
        facts = (StopFacts(stop.kind, stop.signal, stop.origin_rank, stop.lost_node)
                 if stop else None)
        note_crashes(sup.records.values())  # exit 1: a traceback (a crash) or a deliberate 1
        endings = [r.ending() for r in sup.records.values() if r.pid is not None]
        if not endings and stop is not None:  # cancelled before any rank started
            endings = [RankEnding(0, None, stop.signal, 0.0, signalled_first=True)]
        return decide(endings, facts, self.plan.contract, rank0_decides=self.plan.forgelm_mode)

    def _results(self) -> dict[int, dict[str, Any]]:
        if not self.plan.forgelm_mode:
            return {}
        results = {}
        for record in self.supervisor.records.values():
            if record.pid is None:
                continue
            found = extract_result(record.stdout_log)
            if found is not None:
                results[record.rank] = found
        return results

    def _build(self, *, provisional: bool) -> dict[str, Any]:
        """The envelope: the attempt under way (the last one), with every attempt's entry."""
        envelope = self._attempt_envelope(provisional=provisional)
        index = self.supervisor.spec.restart_count
        current = [] if len(self.attempts) > index else [attempt_entry(index, envelope, None,
                                                                       None)]
        if self.backoff_cancel is not None and envelope["cancelled"] is None:
            envelope["cancelled"] = backoff_cancelled(self.backoff_cancel)
        envelope["started_at"] = env_mod.iso(self.started_at or self.supervisor.started_at)
        envelope["duration_s"] = _duration(self.started_at or self.supervisor.started_at,
                                           self.plan.info.ended_at)
        envelope["run_dir"] = self.plan.info.run_dir  # the run's; each attempt's in attempts
        envelope["max_restarts"] = self.plan.spec.max_restarts
        envelope["restart_count"] = index
        envelope["attempts"] = [*self.attempts, *current]
        return envelope

    def _attempt_envelope(self, *, provisional: bool) -> dict[str, Any]:
        sup = self.supervisor
        info = self.plan.info
        info.started_at = sup.started_at
        info.ended_at = None if provisional else sup.ended_at
        info.error = sup.launch_error or info.error
        verdict = self.verdict()
        if provisional and sup.launch_error is None:
            verdict = _provisional_verdict(verdict)
        envelope = env_mod.build(
            info,
            verdict,
            sup.records.values(),
            stop=sup.stop,
            cancels=sup.cancels,
            forwards=sup.forwards,
            descendants=sup.descendants.entries(),
            results={} if provisional else self._results(),
            provisional=provisional,
        )
        error = sup.faults.error
        envelope["supervisor_error"] = error.to_dict(env_mod.iso(error.at)) if error else None
        envelope["run_dir"] = str(sup.spec.run_dir)  # an attempt's own files (attempt-K/)
        return envelope

    def close_attempt(self) -> tuple[RestartDecision, float]:
        """The attempt under way ended: its entry in ``attempts``, and whether it restarts
        (engine/restart_policy.py) after how long."""
        sup = self.supervisor
        index = sup.spec.restart_count
        self.started_at = self.started_at or sup.started_at
        facts = attempt_facts(sup, self.verdict())
        decision = decide_restart(facts, index, self.plan.spec.max_restarts)
        delay = backoff(self.plan.info.restart_backoff, index + 1) if decision.restart else 0.0
        entry = attempt_entry(index, self._attempt_envelope(provisional=False), decision,
                              delay if decision.restart else None)
        self.attempts.append(entry)
        if decision.restart:  # on disk while it waits: a scheduler's SIGKILL finds it
            self._write(self._build(provisional=True))
        return decision, delay

    def no_restart(self, why: str, cancel: CancelRequest | None = None) -> None:
        """The restart the last attempt's entry announced did not happen (a cancel during the
        backoff, an attempt dir that could not be made): the run ends with its verdict."""
        self.attempts[-1]["restart"].update(restarted=False, why=why)
        self.backoff_cancel = cancel

    def _write(self, envelope: dict[str, Any]) -> list[str]:
        return env_mod.write_all(self.plan.envelope_paths, envelope)

    def final(self) -> RunEnding:
        faults = self.supervisor.faults
        errors_before = faults.count
        envelope = self._build(provisional=False)
        written, errors = env_mod.write_each(self.plan.envelope_paths, envelope)
        path = written[0] if written else None
        self.ending = RunEnding(self.verdict(), envelope, path, tuple(errors), tuple(written))
        self.supervisor.emit(ev.VerdictReached(self.ending.verdict, path))
        if faults.count != errors_before:  # a view failed on the verdict: the envelope says so
            envelope = self._build(provisional=False)
            self.ending = replace(self.ending, envelope=envelope,
                                  write_errors=tuple(self._write(envelope)))
        return self.ending


def _duration(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 3)


def backoff_cancelled(cancel: CancelRequest) -> dict[str, Any]:
    """The envelope's ``cancelled`` for a cancel between two attempts (no rank was running)."""
    return {"by": cancel.origin, "signal": signal_name(cancel.signal), "at": env_mod.iso(cancel.at),
            "requests": 1, "source": cancel.source.value}


def _provisional_verdict(verdict: Verdict) -> Verdict:
    """While ranks are still stopping, the envelope says so; codes may still change."""
    return replace(verdict, rule_text=f"provisional (run still stopping): {verdict.rule_text}")


class Session:
    """One run as a view sees it: events to subscribe to, commands, and the ending.

    Both views drive the same Session; tests of the TUI drive a scripted stand-in with the
    same surface (tests/scripted.py).
    """

    def __init__(self, plan: Plan, guardian: Guardian | None = None) -> None:
        self.plan = plan
        self.node: NodeRun | None = None
        peers = None
        if plan.cluster is not None:  # multi-node: torch's TCPStore, imported only then
            from forgelm_tui.cluster.link import LinkPeers

            peers = LinkPeers()
        self.chain = AttemptChain(Supervisor(plan.spec, guardian=guardian, peers=peers),
                                  guardian)
        self.report = RunReport(plan, supervisor=self.supervisor)
        self.subscribe(self.report.on_event)
        if peers is not None:
            from forgelm_tui.cluster.node import NodeRun

            self.node = NodeRun(self, peers)

    @property
    def supervisor(self) -> Supervisor:
        """The attempt under way's (the only one unless --max-restarts)."""
        return self.chain.supervisor

    @property
    def ending(self) -> RunEnding | None:
        return self.report.ending

    @property
    def run_id(self) -> str:
        return self.plan.spec.run_id

    @property
    def command(self) -> list[str]:
        return redact_argv(self.plan.info.command)  # what views show (docs/security.md)

    @property
    def world_size(self) -> int:
        return self.plan.spec.world_size

    @property
    def grace(self) -> float:
        return self.plan.spec.grace

    def subscribe(self, listener: Callable[[ev.Event], None]) -> None:
        """Every attempt's events, in order, to the same listener."""
        self.chain.subscribe(listener)

    def snapshot(self) -> ev.RunSnapshot:
        snap = replace(self.supervisor.snapshot(), attempt=self.chain.attempt)
        ending = self.report.ending
        if ending is None:
            return snap
        return replace(snap, verdict=ev.VerdictReached(ending.verdict, ending.envelope_path))

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT, *,
                       source: CancelSource = CancelSource.OPERATOR,
                       cause: str | None = None) -> str:
        if self.chain.backoff is not None:  # between two attempts: no restart, the run ends now
            self.chain.backoff.cancel(CancelRequest(source, origin, sig, time.time(), "stop"))
            return "stop"
        return self.supervisor.request_cancel(origin, sig, source=source, cause=cause)

    def kill_now(self, origin: str = "operator",
                 source: CancelSource = CancelSource.OPERATOR) -> None:
        if self.chain.backoff is not None:
            self.request_cancel(origin, signal.SIGKILL, source=source)
            return
        self.supervisor.kill_now(origin, source)

    def forward(self, sig: int, origin: str | None = "operator",
                source: CancelSource = CancelSource.OPERATOR) -> None:
        if self.chain.backoff is None:  # between two attempts there is no rank to forward to
            self.supervisor.forward(sig, origin, source)

    # the supervisor's own signal handlers (engine/own_signals.py), for the whole run

    def signalled(self, sig: int) -> None:
        if self.chain.backoff is not None:
            self.request_cancel(f"{signal_name(sig)} to the supervisor", sig,
                                source=CancelSource.SIGNAL)
            return
        self.supervisor.signalled(sig)

    def request_stacks(self, origin: str = "operator") -> bool:
        return self.chain.backoff is None and self.supervisor.request_stacks(origin)

    def cancelled_by_signal(self) -> bool:
        """The stop came from a signal to the supervisor (a scheduler), not from a person."""
        cancels = self.supervisor.cancels
        return bool(cancels) and cancels[0].source is CancelSource.SIGNAL

    async def run(self) -> RunEnding:
        async with serving(self, lambda: self.plan.spec.run_dir, self._node_rank):
            await self.run_attempts()
            return await self.finish()

    async def run_attempts(self) -> None:
        """Every attempt (one unless --max-restarts), under the supervisor's own signal handlers
        for the whole of it, between two attempts too."""
        signals = OwnSignals(self, self.plan.spec.forward_signals)
        signals.install(asyncio.get_running_loop())
        try:
            if self.plan.spec.max_restarts:
                self.chain.announce(0, self.plan.spec.max_restarts, "", 0.0)
            while True:
                await self.chain.supervise()
                decision, delay = self.report.close_attempt()
                if not decision.restart or not await self._restart(decision.why, delay):
                    return
        finally:
            signals.remove()

    async def _restart(self, why: str, delay: float) -> bool:
        """Wait ``delay`` (a cancel ends the run at once), then the next attempt's supervisor."""
        attempt = self.supervisor.spec.restart_count + 1
        self.chain.announce(attempt, self.plan.spec.max_restarts, why, delay)
        cancel = await self.chain.wait(delay)
        if cancel is not None:
            self.report.no_restart(f"cancelled during the backoff by {cancel.origin}", cancel)
            return False
        spec = self.plan.spec.for_attempt(attempt)
        error = make_attempt_dir(spec.run_dir)
        if error is not None:
            self.report.no_restart(error)
            return False
        self.report.supervisor = self.chain.next(spec)
        return True

    def _node_rank(self) -> int | None:
        return self.plan.spec.node_rank if self.plan.cluster is not None else None

    async def finish(self) -> RunEnding:
        """The verdict and the envelope, once every rank (on every node) has ended."""
        if self.node is not None:
            return await self.node.finish()
        return self.report.final()


async def _run_then_ignore_signals(session: Session) -> RunEnding:
    async with serving(session, lambda: session.plan.spec.run_dir,  # attach (SPEC §9)
                       session._node_rank):
        try:
            await session.run_attempts()
        finally:
            ignore_stop_signals()  # the ranks are gone: nothing may cut the envelope short now
        return await session.finish()


def execute(plan: Plan) -> int:
    """Run the plan headless to the end and return the process exit code."""
    guardian = Guardian()  # forked first, before any thread exists
    sink = OutputSink(2 if plan.output_format == "json" else 1)
    session = Session(plan, guardian)
    view = HeadlessView(sink)
    session.subscribe(view)
    try:
        ending = asyncio.run(_run_then_ignore_signals(session))
    except Exception as exc:  # past every other net: the guardian stops every rank group
        guardian.abandon()
        sink.close()
        return report_internal_error(plan, exc, stderr_line, emit_json)
    finally:
        guardian.close()
    for error in ending.write_errors:
        view.note(error)
    for line in ending_notes(ending.envelope):
        view.note(line)
    if (lost := not_kept_line(ending.envelope)) is not None:
        view.note(lost)
    local = set(session.supervisor.records)
    remote = [r for r in ending.envelope.get("ranks", []) if r["rank"] not in local]
    view.summary(session.supervisor.records.values(), ending.verdict,
                 ending.where_line(plan.output_format == "json"), remote)
    sink.close()
    if plan.output_format == "json":
        emit_json(ending.envelope)
    return ending.verdict.code


def emit_json(envelope: dict[str, Any]) -> None:
    """The envelope, and only the envelope, on stdout; a closed stdout changes nothing."""
    data = json.dumps(envelope, indent=2, ensure_ascii=False) + "\n"
    sink = OutputSink(1)
    sink.write(data)
    sink.close()


def prelaunch_error(
    message: str,
    info: RunInfo,
    envelope_paths: list[Path],
    output_format: str,
    say: Callable[[str], None],
) -> int:
    """Report a pre-launch failure: one line, an envelope that says why, exit 1."""
    info.error = message
    verdict = prelaunch_failure()
    envelope = env_mod.build(info, verdict)
    envelope.update(supervisor_error=None, max_restarts=info.max_restarts, restart_count=0,
                    attempts=[])
    written, errors = env_mod.write_each(envelope_paths, envelope)
    ending = RunEnding(verdict, envelope, None, tuple(errors), tuple(written))
    where = ending.where_line(output_format == "json")
    say(f"forgelm-tui: error: {redact_text(message)} (exit 1 EXIT_CONFIG_ERROR{where})")
    for error in errors:
        say(f"forgelm-tui: {error}")
    if output_format == "json":
        emit_json(envelope)
    return verdict.code


def ignore_stop_signals() -> None:
    """Once the ranks are gone, a late SIGTERM must not cut the envelope or summary short."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)


def stderr_line(message: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
