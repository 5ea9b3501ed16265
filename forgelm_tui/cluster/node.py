"""A Session's multi-node part: join before the launch, the link while the run lasts, one
agreed verdict at the end (SPEC §8). The single-node path never imports this module."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from forgelm_tui.cluster import agreement
from forgelm_tui.cluster.join import JoinCancelled, JoinRefused, Membership
from forgelm_tui.cluster.link import NodeLink
from forgelm_tui.cluster.rejoin import RoundJoiner
from forgelm_tui.cluster.restart import (
    ClosedAttempt,
    ack,
    decide_attempt,
    first_record,
    publish_verdict,
    read_verdict,
    run_outcome,
)
from forgelm_tui.cluster.store import StoreLost, StoreTimeout
from forgelm_tui.cluster.summary import LinkPeers
from forgelm_tui.cluster.views import node_changed
from forgelm_tui.cluster.wire import ending_to_wire, stop_from_wire, stop_to_wire
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.codec import DecodeError, decode, encode, to_wire
from forgelm_tui.engine.events import NodeState
from forgelm_tui.engine.hooks import Hooks
from forgelm_tui.engine.records import CancelRequest
from forgelm_tui.engine.restart_policy import RestartDecision
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.envelope import build as env_mod
from forgelm_tui.envelope.entries import cancelled_entry
from forgelm_tui.envelope.write import write_each
from forgelm_tui.plan.planner import Plan
from forgelm_tui.plan.requeue import requeue_count, requeue_dir, requeues_entry
from forgelm_tui.private_files import make_private_dir
from forgelm_tui.session.ending import RunEnding
from forgelm_tui.session.outcome import Agreement, NodeOutcome, RunOutcome
from forgelm_tui.session.report import RunReport


class Host(Protocol):
    """The run's session as its node part sees it (run.Session; not imported: run.py makes
    the NodeRun, and the module graph has no cycle, tests/test_structure.py). The node's part
    takes the plan it adopts at the join, sets the run's ending, and fills the hooks."""

    plan: Plan
    hooks: Hooks
    report: RunReport

    @property
    def supervisor(self) -> Supervisor: ...


class NodeRun:
    def __init__(self, session: Host, peers: LinkPeers) -> None:
        assert session.plan.cluster is not None
        self.session = session
        self.config = session.plan.cluster
        self.peers = peers
        session.hooks.before_launch = self.join
        session.hooks.local_done = self.local_done
        self.joiner: RoundJoiner | None = None
        self.membership: Membership | None = None
        self.link: NodeLink | None = None
        self.own_final: dict[str, Any] | None = None
        self.last: RunOutcome | None = None  # the last ended attempt's agreed outcome
        self.backoff_abort: dict[str, Any] | None = None  # a cancel during the backoff

    @property
    def sup(self) -> Supervisor:
        """The attempt under way's supervisor."""
        return self.session.supervisor

    # ------------------------------------------------------------------ before the launch

    async def join(self) -> None:
        loop = asyncio.get_running_loop()
        if self.sup.spec.restart_count > 0:  # a restart: every node joined it already
            self._start_link(loop)
            return

        def notice(text: str) -> None:  # the join's thread: a line for the views
            loop.call_soon_threadsafe(self.sup.emit, ev.RunNotice(text, time.time()))

        self.joiner = joiner = RoundJoiner(self.config, lambda: self.sup.stop is not None,
                                      notice=notice)
        try:
            membership = await loop.run_in_executor(None, joiner.join)
        except JoinRefused as exc:
            if exc.stop is not None:  # another node was cancelled while joining
                self.sup.apply_stop(stop_from_wire(exc.stop))
            else:
                self.sup.refuse_launch(str(exc))
            return
        except JoinCancelled:
            stop = self.sup.stop
            assert stop is not None
            message = f"cancelled on a node while joining ({stop.origin})"
            await loop.run_in_executor(None, joiner.abandon, message, stop_to_wire(stop))
            return
        except (StoreLost, StoreTimeout) as exc:
            self.sup.refuse_launch(f"control store: {exc}")
            return
        error = self._settle(membership)
        if error is not None:
            self.sup.refuse_launch(error)
            return
        self.membership = membership
        self._start_link(loop)

    def _start_link(self, loop: asyncio.AbstractEventLoop) -> None:
        joiner, membership, hooks = self.joiner, self.membership, self.session.hooks
        assert joiner is not None and joiner.store is not None and membership is not None
        self.own_final = None
        self.link = NodeLink(self.sup, membership, self.config, joiner.store, self.peers,
                             watching=lambda: hooks.watching(), spares=joiner.spares)
        self.link.start(loop)

    def _settle(self, membership: Membership) -> str | None:
        """The plan as the join settled it: run id, node rank, master address, run dir."""
        session, plan = self.session, self.session.plan
        root = plan.cluster_root or Path("forgelm-tui-runs").absolute() / membership.run_id
        requeued = requeue_count(os.environ)  # a requeued SLURM job: beside the earlier runs
        node_dir = root / f"node-{membership.node_id}"  # elastic: node ranks change, not ids
        run_dir = requeue_dir(node_dir, requeued)
        try:
            make_private_dir(run_dir)  # 0700 (docs/security.md)
        except OSError as exc:
            return f"--run-dir {run_dir}: cannot create ({exc.strerror})"
        spec = dataclasses.replace(
            plan.spec, run_id=membership.run_id, run_dir=run_dir,
            node_rank=membership.node_rank, nnodes=membership.nnodes,
            master_addr=membership.master_addr, master_port=membership.master_port)
        joined = membership.attempt  # a node that joined an elastic run late: that attempt's
        own = spec.for_attempt(joined, joined - membership.restarts_used) if joined else spec
        try:
            make_private_dir(own.run_dir)
        except OSError as exc:
            return f"--run-dir {own.run_dir}: cannot create ({exc.strerror})"
        self.sup.settle(own)
        info = dataclasses.replace(plan.info, spec=spec, run_id=membership.run_id,
                                   run_dir=str(run_dir),
                                   requeues=requeues_entry(node_dir, requeued))
        paths = [run_dir / "envelope.json", *plan.envelope_paths[1:]]
        if spec.node_rank != 0:  # ForgeLM's output dir is the job's, shared: node 0 writes it
            paths = [p for p in paths if str(p) != info.last_exit_path]
        session.plan = plan = dataclasses.replace(plan, spec=spec, info=info,
                                                  envelope_paths=paths)
        session.report.plan = plan
        return None

    # ------------------------------------------------------------------ this node's ranks over

    def local_done(self) -> None:
        """Every rank here ended: publish their records for node 0's verdict."""
        report, sup = self.session.report, self.sup
        sup.ended_at = time.time()
        host = socket.gethostname()
        outcome = report.node_outcome(provisional=False, where=(
            host, os.getpid(), str(self.session.plan.spec.run_dir)))
        view = node_changed(sup.spec.node_rank, host, NodeState.DONE,
                            sup.records.values())
        self.own_final = {
            "outcome": encode(outcome),
            "endings": [ending_to_wire(e) for e in report.endings()],
            "launch_error": sup.launch_error, "view": to_wire(view)}
        if self.link is not None:
            self.link.publish_final(self.own_final)

    # ------------------------------------------------------------------ the verdict

    async def close_attempt(self) -> tuple[RestartDecision, float]:
        """Every node's ranks of the attempt ended: node 0 decides its verdict and whether
        the run restarts, once for every node (cluster/restart.py); the others read both."""
        report = self.session.report
        if self.link is None or self.membership is None:
            return report.close_attempt()  # never joined (refused or cancelled): alone
        closed: ClosedAttempt | None
        try:
            if self.membership.node_rank == 0:
                closed = await self._decide_and_publish()
            else:
                closed = await self._await_verdict()
        finally:
            self.link.close()
        if closed is None:  # decided without agreement: the run ends here
            return RestartDecision(False, "decided without agreement"), 0.0
        self.last = closed.outcome
        report.started_at = closed.started_at
        report.attempts.append(closed.entry(self.session.plan.info, str(self.sup.spec.run_dir)))
        if closed.decision.restart:  # on disk while it waits: a scheduler's SIGKILL finds it
            self._write_copy(self.run_outcome(provisional=True))
        return closed.decision, closed.delay

    async def finish(self) -> RunEnding:
        """The run's envelope on this node: the last attempt's agreed outcome with every
        attempt's entry (or what this node decided alone)."""
        report = self.session.report
        if report.ending is not None:  # decided without agreement
            return report.ending
        if self.last is None:
            return report.final()  # never joined: decided alone
        return self._write(self.run_outcome())

    def run_outcome(self, *, provisional: bool = False) -> RunOutcome:
        assert self.last is not None
        report = self.session.report
        return run_outcome(self.last, report.attempts, self.session.plan.spec.max_restarts,
                           report.started_at, provisional=provisional,
                           cancelled=None if self.backoff_abort is None
                           else self.backoff_abort.get("cancel"), scheduler=report.scheduler)

    async def _decide_and_publish(self) -> ClosedAttempt:
        link, loop = self._link(), asyncio.get_running_loop()
        assert self.own_final is not None
        finals = {0: self.own_final, **link.finals}
        lost = sorted(n for n, p in link.liveness.peers.items() if p.state is NodeState.LOST)
        store = link.store
        stop = await loop.run_in_executor(None, first_record, store, "stop")
        first_failure = await loop.run_in_executor(None, first_record, store, "first-failure")
        verdict = agreement.decide_global(finals, stop, self.session.plan.contract,
                                          first_failure,
                                          rank0_decides=self.session.plan.forgelm_mode,
                                          lost=link.lost_before_failure())
        nodes = [decode(NodeOutcome, finals[n]["outcome"]) for n in sorted(finals)]
        report, sup = self.session.report, self.sup
        outcome = dataclasses.replace(
            report.outcome(provisional=False), verdict=verdict, nodes=tuple(nodes),
            stop=None if stop is None else agreement.agreed_stop(sup.stop, stop),
            agreement=Agreement(True, 0, tuple(lost), self.membership_nnodes()))
        closed = decide_attempt(outcome, sup, self.session.plan,
                                report.started_at or sup.started_at)
        waiting = [n for n in range(1, self.membership_nnodes()) if n not in lost]
        await loop.run_in_executor(None, publish_verdict, store, closed,  # node 0 waits for
                                   0 if closed.decision.restart else len(waiting),  # readers
                                   self.config.ack_wait)
        return closed

    async def _await_verdict(self) -> ClosedAttempt | None:
        link, loop = self._link(), asyncio.get_running_loop()
        deadline = time.monotonic() + max(2 * self.config.node_timeout, 10.0)
        published = None
        while link.store_lost is None and time.monotonic() < deadline:
            published = await loop.run_in_executor(None, read_verdict, link.store)
            if published is not None:
                break
            link.verdict_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(link.verdict_ready.wait(), 0.25)
        if published is None:
            self._without_agreement(link.store_lost or "no verdict from node 0 in time")
            return None
        try:
            closed = ClosedAttempt.from_wire(published)
        except (DecodeError, KeyError, TypeError) as exc:
            self._without_agreement(f"node 0's outcome could not be read ({exc})")
            return None
        await loop.run_in_executor(None, ack, link.store)  # node 0 may leave now: it is last
        return closed

    def _without_agreement(self, why: str) -> RunEnding:
        report = self.session.report
        if self.link is not None:  # a failure here may be collateral of node 0's loss
            report.lost_cause = self.link.lost_before_failure()
        return self._write(report.outcome(provisional=False, agreement=Agreement(
            False, self.sup.spec.node_rank, note=f"decided without agreement: {why}")))

    def _write(self, outcome: RunOutcome) -> RunEnding:
        """This node's copy of the run's outcome: its own run dir, node rank and command."""
        envelope, written, errors = self._write_copy(outcome)
        path = written[0] if written else None
        ending = RunEnding(outcome.verdict, envelope, path, tuple(errors), tuple(written))
        self.session.report.ending = ending
        self.sup.emit(ev.VerdictReached(outcome.verdict, path))
        return ending

    def _write_copy(self, outcome: RunOutcome) -> tuple[dict[str, Any], list[str], list[str]]:
        plan = self.session.plan
        return write_each(plan.envelope_paths, lambda failed: env_mod.build(
            plan.info, outcome, run_dir=str(plan.spec.run_dir), not_written=failed))

    # ------------------------------------------------------------------ a restart

    async def rejoin(self, attempt: int, spec: LaunchSpec,
                     cancelled: Callable[[], bool]) -> tuple[LaunchSpec, str | None]:
        """Restart ``attempt``: every node joins it again (cluster/join.py); the spec with
        the attempt's master port, or why the restart cannot start."""
        joiner, loop = self.joiner, asyncio.get_running_loop()
        assert joiner is not None and self.membership is not None
        joiner.cancelled = cancelled
        try:
            membership = await loop.run_in_executor(None, joiner.rejoin, spec.run_id,
                                                    spec.node_rank, attempt,
                                                    spec.restarts_used)
        except JoinRefused as exc:
            if exc.cancel is not None:  # another node's cancel during the backoff: its words
                self.backoff_abort = {"message": str(exc), "cancel": exc.cancel}
                return spec, str(exc)
            return spec, f"the restart could not start: {exc}"
        except JoinCancelled:
            return spec, "cancelled while the nodes joined the restart"
        except (StoreLost, StoreTimeout) as exc:
            return spec, f"the restart could not start: control store: {exc}"
        self.membership = membership
        if membership.attempt != attempt:  # too late for an elastic round: a later one
            spec = self.session.plan.spec.for_attempt(
                membership.attempt, membership.attempt - membership.restarts_used)
            with contextlib.suppress(OSError):
                make_private_dir(spec.run_dir)
        spec = dataclasses.replace(  # an elastic round may have other nodes, other ranks
            spec, master_addr=membership.master_addr, master_port=membership.master_port,
            node_rank=membership.node_rank, nnodes=membership.nnodes)
        plan = self.session.plan
        self.session.plan = plan = dataclasses.replace(  # the envelope's launch facts
            plan, info=dataclasses.replace(plan.info, spec=spec))
        self.session.report.plan = plan
        return spec, None

    async def refuse_restart(self, attempt: int, why: str) -> None:
        """This node cannot start the restart (its attempt dir): every node ends the run."""
        joiner, loop = self.joiner, asyncio.get_running_loop()
        if joiner is not None:
            await loop.run_in_executor(None, joiner.abort_restart, self.session.plan.spec.run_id,
                                       attempt, f"node {self.sup.spec.node_rank}: {why}", None)

    async def abort_restart(self, attempt: int, cancel: CancelRequest) -> str:
        """A cancel during the backoff (here, or another node's): every node ends the run,
        saying the first cancel (its node, who asked); why the restart did not happen."""
        joiner, loop = self.joiner, asyncio.get_running_loop()
        assert joiner is not None
        entry = cancelled_entry(cancel, 1)
        self.backoff_abort = abort = await loop.run_in_executor(
            None, joiner.abort_restart, self.session.plan.spec.run_id, attempt,
            f"cancelled during the backoff on node {self.sup.spec.node_rank} by "
            f"{entry['by']}", entry)
        return str(abort["message"])

    @contextlib.asynccontextmanager
    async def watching_backoff(self, attempt: int,
                               cancel: Callable[[dict[str, Any]], None]) -> AsyncIterator[None]:
        """While the backoff waits: another node's cancel ends it here too."""
        joiner, loop = self.joiner, asyncio.get_running_loop()
        if joiner is None or self.membership is None:
            yield
            return
        done = threading.Event()
        watch = loop.run_in_executor(None, joiner.watch_restart, self.session.plan.spec.run_id,
                                     attempt, done.is_set)

        def seen(future: asyncio.Future[dict[str, Any] | None]) -> None:
            abort = None if future.cancelled() else future.result()
            if abort is not None and not done.is_set():
                cancel(abort)

        watch.add_done_callback(seen)
        try:
            yield
        finally:
            done.set()

    def _link(self) -> NodeLink:
        assert self.link is not None
        return self.link

    def membership_nnodes(self) -> int:
        assert self.membership is not None
        return self.membership.nnodes
