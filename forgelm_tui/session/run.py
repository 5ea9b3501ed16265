"""One run from plan to exit code: engine + view + verdict + envelope, on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forgelm_tui.cluster.scheduler_stop import SchedulerCause
from forgelm_tui.control.server import serving
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.hooks import Hooks
from forgelm_tui.engine.loop import new_loop
from forgelm_tui.engine.own_signals import OwnSignals, take_senders
from forgelm_tui.engine.records import CancelRequest, CancelSource
from forgelm_tui.engine.restart_policy import RestartDecision
from forgelm_tui.engine.signal_inbox import Sender
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.envelope.build import without_attempts
from forgelm_tui.envelope.storage import not_kept_line
from forgelm_tui.envelope.write import write_each
from forgelm_tui.headless.view import HeadlessView, OutputSink
from forgelm_tui.plan.planner import Plan, RunInfo
from forgelm_tui.redact import redact_argv, redact_text
from forgelm_tui.session.attempts import AttemptChain, Backoff, make_attempt_dir, remote_cancel
from forgelm_tui.session.ending import RunEnding
from forgelm_tui.session.internal_error import report_internal_error
from forgelm_tui.session.report import RunReport
from forgelm_tui.signames import signal_name
from forgelm_tui.verdict import prelaunch_failure
from forgelm_tui.wording.ending import ending_notes

if TYPE_CHECKING:
    from forgelm_tui.cluster.node import NodeRun


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
            from forgelm_tui.cluster.summary import LinkPeers

            peers = LinkPeers()
        self._early_cancel: CancelRequest | None = None  # before the backoff (several nodes)
        self.hooks = Hooks()  # the node's join and publish, the view's hang-up: every attempt's
        self.chain = AttemptChain(Supervisor(plan.spec, guardian=guardian, peers=peers,
                                             hooks=self.hooks), guardian, peers)
        self.report = RunReport(plan, supervisor=self.supervisor)
        self.subscribe(self.report.on_event)
        self.scheduler_cause = SchedulerCause(os.environ, lambda: self.supervisor,
                                              plan.info.kill_window, plan.info.grace_source)
        self.subscribe(self.scheduler_cause.on_event)
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
        return self.report.supervisor.grace_in_force

    def subscribe(self, listener: Callable[[ev.Event], None]) -> None:
        """Every attempt's events, in order, to the same listener."""
        self.chain.subscribe(listener)

    def snapshot(self) -> ev.RunSnapshot:
        # argv: the command the operator ran (as the launching TUI shows it), redacted
        snap = replace(self.supervisor.snapshot(), attempt=self.chain.attempt,
                       argv=tuple(self.command))
        ending = self.report.ending
        if ending is None:
            return snap
        return replace(snap, verdict=ev.VerdictReached(ending.verdict, ending.envelope_path))

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT, *,
                       source: CancelSource = CancelSource.OPERATOR,
                       sender: Sender | None = None) -> str:
        if self.chain.backoff is not None:  # between two attempts: no restart, the run ends now
            self.chain.backoff.cancel(CancelRequest(source, origin, sig, time.time(), "stop",
                                                    sender))
            return "stop"
        self._keep(CancelRequest(source, origin, sig, time.time(), "stop", sender))
        return self.supervisor.request_cancel(origin, sig, source=source, sender=sender)

    def _keep(self, cancel: CancelRequest) -> None:
        """Several nodes: a cancel once this node's ranks are over (the others' may still run,
        or node 0 may be deciding a restart) also cancels a restart (the backoff's first)."""
        if self.node is not None and self.supervisor.ended_at is not None:
            self._early_cancel = self._early_cancel or cancel

    def kill_now(self, origin: str = "operator",
                 source: CancelSource = CancelSource.OPERATOR) -> None:
        if self.chain.backoff is not None:
            self.request_cancel(origin, signal.SIGKILL, source=source)
            return
        self.supervisor.kill_now(origin, source)

    def forward(self, sig: int, origin: str | None = "operator",
                source: CancelSource = CancelSource.OPERATOR, sender: Sender | None = None) -> None:
        if self.chain.backoff is None:  # between two attempts there is no rank to forward to
            self.supervisor.forward(sig, origin, source, sender)

    # the supervisor's own signal handlers (engine/own_signals.py), for the whole run

    def signalled(self, sig: int, sender: Sender | None = None) -> None:
        if self.chain.backoff is not None:
            self.request_cancel(f"{signal_name(sig)} to the supervisor", sig,
                                source=CancelSource.SIGNAL, sender=sender)
            return
        self._keep(CancelRequest(CancelSource.SIGNAL, f"{signal_name(sig)} to the supervisor",
                                 sig, time.time(), "stop", sender))
        self.supervisor.signalled(sig, sender)

    def request_stacks(self, origin: str = "operator") -> bool:
        return self.chain.backoff is None and self.supervisor.request_stacks(origin)

    def cancelled_by_signal(self) -> bool:
        """The stop came from a signal to the supervisor (a scheduler), not from a person."""
        cancels = self.supervisor.cancels
        return bool(cancels) and cancels[0].source is CancelSource.SIGNAL

    async def run(self) -> RunEnding:
        async with self.serving():
            await self.run_attempts()
            return await self.finish()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Attach (SPEC §9) while the block runs; this node views other nodes' ranks while
        its view is the TUI or a viewer is attached: their rows, and the ranks of the nodes they
        opened (cluster/views.py)."""
        async with serving(self, lambda: self.plan.spec.run_dir, self._node_rank) as server:
            view = self.hooks.watching  # the TUI's (tui/launch.py); nothing headless
            self.hooks.watching = lambda: view() | server.watching()
            yield

    async def run_attempts(self) -> None:
        """Every attempt (one unless --max-restarts), under the supervisor's own signal handlers
        for the whole of it, between two attempts too."""
        signals = OwnSignals(self, self.plan.spec.forward_signals)
        signals.install(asyncio.get_running_loop())
        try:
            if self.plan.spec.max_restarts:
                self.chain.announce(0, self.plan.spec.max_restarts, "", 0.0,
                                    self.plan.spec.nnodes)
            while True:
                await self.chain.supervise()
                decision, delay = await self._close_attempt()
                if not decision.restart or not await self._restart(decision, delay):
                    return
        finally:
            signals.remove()

    async def _close_attempt(self) -> tuple[RestartDecision, float]:
        if self.node is None:
            return self.report.close_attempt()
        async with self.chain.between() as waiting:  # a cancel while node 0 decides is kept
            self.report.scheduler = await self.scheduler_cause.settle()  # in node 0's record
            decided = await self.node.close_attempt()  # one decision for every node
        self._early_cancel = self._early_cancel or waiting.cancel_request
        return decided

    async def _restart(self, decision: RestartDecision, delay: float) -> bool:
        """Wait ``delay`` (a cancel ends the run at once; on several nodes, a cancel on any
        node), then the next attempt's supervisor (on several nodes, once every node joined
        it: cluster/node.py)."""
        last = self.supervisor.spec
        attempt = last.restart_count + 1
        elastic = self.plan.cluster is not None and self.plan.cluster.elastic
        spec = self.plan.spec.for_attempt(attempt, last.uncounted + (not decision.counted))
        most = spec.max_restarts + spec.uncounted  # a node joining is one attempt more
        self.chain.announce(attempt, most, decision.why, delay,
                            1 if elastic else self.plan.spec.nnodes)  # elastic: once known
        async with self.chain.between() as backoff:
            if self._early_cancel is not None:  # came while node 0 decided the restart
                backoff.cancel(self._early_cancel)
            error = await self._between(backoff, attempt, delay)
            if error is not None and self.node is not None:  # the others end with it
                await self.node.refuse_restart(attempt, error)
            elif backoff.cancel_request is None and self.node is not None:
                spec, error = await self.node.rejoin(
                    attempt, spec, lambda: backoff.cancel_request is not None)
            cancel = backoff.cancel_request
        if cancel is not None:
            error = f"cancelled during the backoff by {cancel.origin}" if self.node is None \
                else await self.node.abort_restart(attempt, cancel)
        if error is not None:
            self.report.no_restart(error, cancel)
            return False
        if elastic:  # the round's membership, known now
            self.supervisor.emit(ev.RunNotice(
                f"attempt {attempt + 1}/{most + 1}: {spec.nnodes} nodes, WORLD_SIZE "
                f"{spec.world_size}", time.time()))
        self.report.supervisor = self.chain.next(spec)
        self._early_cancel = None
        return True

    async def _between(self, backoff: Backoff, attempt: int, delay: float) -> str | None:
        """The backoff (on several nodes, another node's cancel ends it too), then the
        attempt's directory; why the restart cannot start, if it cannot."""
        if self.node is None:
            await backoff.wait(delay)
        else:
            async with self.node.watching_backoff(attempt, lambda abort: backoff.cancel(
                    remote_cancel(abort))):
                await backoff.wait(delay)
        if backoff.cancel_request is not None:
            return None
        return make_attempt_dir(self.plan.spec.for_attempt(attempt).run_dir)

    def _node_rank(self) -> int | None:
        return self.plan.spec.node_rank if self.plan.cluster is not None else None

    async def finish(self) -> RunEnding:
        """The verdict and the envelope, once every rank (on every node) has ended."""
        self.report.scheduler = await self.scheduler_cause.settle()  # stop.scheduler
        if self.node is not None:
            return await self.node.finish()
        return self.report.final()


async def _run_then_ignore_signals(session: Session) -> RunEnding:
    async with session.serving():
        try:
            await session.run_attempts()
        finally:
            ignore_stop_signals()  # the ranks are gone: nothing may cut the envelope short now
        return await session.finish()


def execute(plan: Plan) -> int:
    """Run the plan headless to the end and return the process exit code."""
    guardian = Guardian()  # forked first, before any thread exists
    take_senders(plan.spec.forward_signals)  # ...and this before any thread exists too
    sink = OutputSink(2 if plan.output_format == "json" else 1)
    session = Session(plan, guardian)
    view = HeadlessView(sink, plan.output_ranks)
    session.subscribe(view)
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:  # a rank's exit first
            ending = runner.run(_run_then_ignore_signals(session))
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
    verdict = prelaunch_failure()
    envelope, written, errors = write_each(envelope_paths, lambda failed: without_attempts(
        info, verdict, error=message, not_written=failed))
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
