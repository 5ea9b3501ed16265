"""One run from plan to exit code: engine + view + verdict + envelope, on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forgelm_tui import envelope as env_mod
from forgelm_tui.control.server import serving
from forgelm_tui.ending import RunEnding
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.crash import note_crashes
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.records import CancelSource
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.forgelm_mode import extract_result
from forgelm_tui.headless import HeadlessView, OutputSink
from forgelm_tui.plan import Plan, RunInfo
from forgelm_tui.verdict import RankEnding, StopFacts, Verdict, decide, prelaunch_failure

if TYPE_CHECKING:
    from forgelm_tui.cluster.node import NodeRun


class RunReport:
    """Builds and writes the envelope; provisional at the start of a stop, final at the end."""

    def __init__(self, plan: Plan, supervisor: Supervisor) -> None:
        self.plan = plan
        self.supervisor = supervisor
        self.ending: RunEnding | None = None

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunStopping):
            self._write(self._build(provisional=True))

    def verdict(self) -> Verdict:
        sup = self.supervisor
        if sup.launch_error is not None:
            return prelaunch_failure()
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
            forwards=sup.forwards,
            results={} if provisional else self._results(),
            provisional=provisional,
        )

    def _write(self, envelope: dict[str, Any]) -> list[str]:
        return env_mod.write_all(self.plan.envelope_paths, envelope)

    def final(self) -> RunEnding:
        envelope = self._build(provisional=False)
        errors = self._write(envelope)
        path = str(self.plan.envelope_paths[0]) if self.plan.envelope_paths else None
        self.ending = RunEnding(self.verdict(), envelope, path, tuple(errors))
        self.supervisor.emit(ev.VerdictReached(self.ending.verdict, path))
        return self.ending


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
        self.supervisor = Supervisor(plan.spec, guardian=guardian, peers=peers)
        self.report = RunReport(plan, supervisor=self.supervisor)
        self.supervisor.subscribe(self.report.on_event)
        if peers is not None:
            from forgelm_tui.cluster.node import NodeRun

            self.node = NodeRun(self, peers)

    @property
    def ending(self) -> RunEnding | None:
        return self.report.ending

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

    def snapshot(self) -> ev.RunSnapshot:
        snap = self.supervisor.snapshot()
        ending = self.report.ending
        if ending is None:
            return snap
        return replace(snap, verdict=ev.VerdictReached(ending.verdict, ending.envelope_path))

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT, *,
                       source: CancelSource = CancelSource.OPERATOR,
                       cause: str | None = None) -> str:
        return self.supervisor.request_cancel(origin, sig, source=source, cause=cause)

    def kill_now(self, origin: str = "operator",
                 source: CancelSource = CancelSource.OPERATOR) -> None:
        self.supervisor.kill_now(origin, source)

    def forward(self, sig: int, origin: str = "operator",
                source: CancelSource = CancelSource.OPERATOR) -> None:
        self.supervisor.forward(sig, origin, source)

    def cancelled_by_signal(self) -> bool:
        """The stop came from a signal to the supervisor (a scheduler), not from a person."""
        cancels = self.supervisor.cancels
        return bool(cancels) and cancels[0].source is CancelSource.SIGNAL

    async def run(self) -> RunEnding:
        async with serving(self, lambda: self.plan.spec.run_dir, self._node_rank):
            await self.supervisor.run()
            return await self.finish()

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
            await session.supervisor.run()
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
    finally:
        guardian.close()
    for error in ending.write_errors:
        view.note(error)
    local = set(session.supervisor.records)
    remote = [r for r in ending.envelope.get("ranks", []) if r["rank"] not in local]
    view.summary(session.supervisor.records.values(), ending.verdict, ending.envelope_path,
                 remote)
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
