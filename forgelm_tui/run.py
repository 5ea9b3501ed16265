"""One run from plan to exit code: engine + view + verdict + envelope, on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
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
        self.provisional_errors: list[str] = []

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
    from dataclasses import replace

    return replace(verdict, rule_text=f"provisional (run still stopping): {verdict.rule_text}")


def execute(plan: Plan) -> int:
    """Run the plan to the end and return the process exit code."""
    guardian = Guardian()  # forked first, before any thread exists
    human_fd = 2 if plan.output_format == "json" else 1
    sink = OutputSink(human_fd)
    supervisor = Supervisor(plan.spec, guardian=guardian)
    report = RunReport(plan, supervisor)
    supervisor.subscribe(report.on_event)
    view = HeadlessView(sink)
    supervisor.subscribe(view)
    try:
        asyncio.run(supervisor.run())
    finally:
        ignore_stop_signals()
        guardian.close()
    outcome = report.final()
    for error in outcome.write_errors:
        view.note(error)
    view.summary(supervisor.records.values(), outcome.verdict, outcome.envelope_path)
    if plan.output_format == "json":
        sink.close()
        emit_json(outcome.envelope)
    else:
        sink.close()
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
