"""One run from plan to exit code: engine + view + verdict + envelope, on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from forgelm_tui import envelope as env_mod
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.forgelm_mode import extract_result
from forgelm_tui.headless import HeadlessView, OutputSink
from forgelm_tui.verdict import Contract, StopFacts, Verdict, decide, prelaunch_failure


@dataclass
class Plan:
    """What the CLI decided: the launch spec plus how to report the run."""

    spec: LaunchSpec
    info: env_mod.RunInfo
    contract: Contract = Contract.FORGELM
    output_format: str = "text"  # text | json
    view: str = "headless"  # headless | tui
    envelope_paths: list[Path] = field(default_factory=list)
    forgelm_mode: bool = False


@dataclass
class Outcome:
    verdict: Verdict
    envelope: dict[str, Any]
    envelope_path: str | None
    write_errors: list[str]


class RunReport:
    """Builds and writes the envelope; provisional at the start of a stop, final at the end."""

    def __init__(self, plan: Plan, supervisor: Supervisor) -> None:
        self.plan = plan
        self.supervisor = supervisor

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunStopping):
            self._write(self._build(provisional=True))

    def verdict(self) -> Verdict:
        sup = self.supervisor
        if sup.launch_error is not None:
            return prelaunch_failure()
        stop = StopFacts(sup.stop.kind, sup.stop.signal) if sup.stop else None
        outcomes = [r.outcome() for r in sup.records.values()]
        return decide(outcomes, stop, self.plan.contract)

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
        sup = self.supervisor
        info = self.plan.info
        info.started_at = sup.started_at
        info.ended_at = None if provisional else sup.ended_at
        info.error = sup.launch_error or info.error
        verdict = self.verdict()
        if provisional and sup.launch_error is None:
            verdict = _provisional_verdict(verdict)
        return env_mod.build(
            info,
            verdict,
            sup.records.values(),
            stop=sup.stop,
            cancels=sup.cancels,
            results={} if provisional else self._results(),
            provisional=provisional,
        )

    def _write(self, envelope: dict[str, Any]) -> list[str]:
        return env_mod.write_all(self.plan.envelope_paths, envelope)

    def final(self) -> Outcome:
        envelope = self._build(provisional=False)
        errors = self._write(envelope)
        path = str(self.plan.envelope_paths[0]) if self.plan.envelope_paths else None
        return Outcome(self.verdict(), envelope, path, errors)


def _provisional_verdict(verdict: Verdict) -> Verdict:
    """While ranks are still stopping, the envelope says so; codes may still change."""
    return replace(verdict, rule_text=f"provisional (run still stopping): {verdict.rule_text}")


class Session:
    """One run as a view sees it: events to subscribe to, commands, and the outcome at the end.

    Both views drive the same Session; tests of the TUI drive a scripted stand-in with the
    same surface.
    """

    def __init__(self, plan: Plan, guardian: Guardian | None = None) -> None:
        self.plan = plan
        self.supervisor = Supervisor(plan.spec, guardian=guardian)
        self.report = RunReport(plan, supervisor=self.supervisor)
        self.supervisor.subscribe(self.report.on_event)
        self.outcome: Outcome | None = None

    @property
    def run_id(self) -> str:
        return self.plan.spec.run_id

    @property
    def command(self) -> list[str]:
        return list(self.plan.info.command)

    @property
    def world_size(self) -> int:
        return self.plan.spec.world_size

    @property
    def grace(self) -> float:
        return self.plan.spec.grace

    def subscribe(self, listener: Callable[[ev.Event], None]) -> None:
        self.supervisor.subscribe(listener)

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT) -> None:
        self.supervisor.request_cancel(origin, sig)

    def kill_now(self, origin: str = "operator") -> None:
        self.supervisor.kill_now(origin)

    def forward(self, sig: int) -> None:
        self.supervisor.forward(sig)

    def cancelled_from_outside(self) -> bool:
        """The stop came from a signal to the supervisor (a scheduler), not from a person."""
        cancels = self.supervisor.cancels
        return bool(cancels) and cancels[0].origin.endswith("to the supervisor")

    async def run(self) -> Outcome:
        await self.supervisor.run()
        self.outcome = self.report.final()
        return self.outcome


async def _run_then_ignore_signals(session: Session) -> Outcome:
    try:
        await session.supervisor.run()
    finally:
        ignore_stop_signals()  # the ranks are gone: nothing may cut the envelope short now
    session.outcome = session.report.final()
    return session.outcome


def execute(plan: Plan) -> int:
    """Run the plan headless to the end and return the process exit code."""
    guardian = Guardian()  # forked first, before any thread exists
    sink = OutputSink(2 if plan.output_format == "json" else 1)
    session = Session(plan, guardian)
    view = HeadlessView(sink)
    session.subscribe(view)
    try:
        outcome = asyncio.run(_run_then_ignore_signals(session))
    finally:
        guardian.close()
    for error in outcome.write_errors:
        view.note(error)
    view.summary(session.supervisor.records.values(), outcome.verdict, outcome.envelope_path)
    sink.close()
    if plan.output_format == "json":
        emit_json(outcome.envelope)
    return outcome.verdict.code


def emit_json(envelope: dict[str, Any]) -> None:
    """The envelope, and only the envelope, on stdout; a closed stdout changes nothing."""
    data = json.dumps(envelope, indent=2, ensure_ascii=False) + "\n"
    sink = OutputSink(1)
    sink.write(data)
    sink.close()


def prelaunch_error(
    message: str,
    info: env_mod.RunInfo,
    envelope_paths: list[Path],
    output_format: str,
    say: Callable[[str], None],
) -> int:
    """Report a pre-launch failure: one line, an envelope that says why, exit 1."""
    info.error = message
    verdict = prelaunch_failure()
    envelope = env_mod.build(info, verdict)
    errors = env_mod.write_all(envelope_paths, envelope)
    where = f"; envelope: {envelope_paths[0]}" if envelope_paths and not errors else ""
    say(f"forgelm-tui: error: {message} (exit 1 EXIT_CONFIG_ERROR{where})")
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
