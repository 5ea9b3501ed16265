"""The coordinator: composes the engine's parts for one node's run and owns nothing else.

rank processes (processes.py) -> output (output.py) and progress (progress.py) -> events;
sampling (sampler.py); the stop policy (policy.py) decides. Views subscribe to events and call
the commands :meth:`request_cancel`, :meth:`kill_now` and :meth:`forward`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence

from forgelm_tui.channel import CHANNEL_ENV, STACKS_ENV, STACKS_SIGNAL
from forgelm_tui.engine import events as ev
from forgelm_tui.engine import signal_inbox
from forgelm_tui.engine.channel import ChannelServer
from forgelm_tui.engine.descendants import Descendants
from forgelm_tui.engine.early_stop import EarlyStop
from forgelm_tui.engine.events import Purpose, RankState
from forgelm_tui.engine.fanout import Fanout, Listener
from forgelm_tui.engine.faults import FaultGuard, SupervisorError, listener_name
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.held_forwards import HeldForwards
from forgelm_tui.engine.hooks import Hooks
from forgelm_tui.engine.output import OutputDrain
from forgelm_tui.engine.policy import OUTSIDE_SIGNAL, Peers, StopPolicy, settings_for
from forgelm_tui.engine.processes import RankProcesses
from forgelm_tui.engine.progress import ProgressReader, open_channel
from forgelm_tui.engine.records import (
    CancelRequest,
    CancelSource,
    ForwardRequest,
    RankRecord,
    StopRecord,
    rank_record,
)
from forgelm_tui.engine.sampler import GpuFold, Sample, SamplingLoop, apply_sample
from forgelm_tui.engine.signal_inbox import Sender
from forgelm_tui.engine.spawn import pipe_capacity
from forgelm_tui.engine.spec import LaunchSpec, rank_argv, rank_env
from forgelm_tui.engine.stacks import StackCapture, find_py_spy
from forgelm_tui.engine.timers import LoopTimers
from forgelm_tui.signames import signal_name

PIPE_EOF_WAIT = 2.0  # after the last rank ends, how long a stray holder may keep its pipes
FAULT_WAIT = 5.0  # after a supervisor error, past the grace: the run ends whatever happened
SIGNALS_WAIT = 1.0  # at the ranks' end, for the signals received before it to be acted on


class Supervisor:
    """Runs one node's ranks from a :class:`LaunchSpec` until every rank has ended."""

    def __init__(self, spec: LaunchSpec, *, guardian: Guardian | None = None,
                 base_env: Mapping[str, str] | None = None, peers: Peers | None = None,
                 hooks: Hooks | None = None) -> None:
        self.spec = spec
        self.hooks = hooks or Hooks()
        self.records = {spec.global_rank(local): rank_record(spec, local)
                        for local in range(spec.nproc_per_node)}
        self.launch_error: str | None = None
        self.forwards: list[ForwardRequest] = []  # for the envelope: what, to whom, who asked
        self._held = HeldForwards()  # forwards that came before the ranks could take them
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.descendants = Descendants(self.records, guardian)  # what ranks leave outside groups
        self._base_env = {**(os.environ if base_env is None else base_env), **self.descendants.env}
        self._guardian = guardian
        self._gpu = GpuFold(self.records, self.emit)  # GPU samples -> records, GpuSampled
        self._events = Fanout(lambda exc, listener: self.faults.caught(
            exc, f"listener {listener_name(listener)}"))
        self._signals_first = self._events.signals_first
        self._shown: dict[int, RankState] = {r: RankState.STARTING for r in self.records}
        self._timers = LoopTimers()
        self._policy = StopPolicy(self.records, settings_for(spec), self, self._timers, peers=peers)
        self._peers = self._policy.peers
        self._stacks = StackCapture(spec.run_dir, self._signal_for_stacks, self.emit,
                                    deadline=spec.stacks_deadline, py_spy=find_py_spy())
        self._early = EarlyStop(self._timers, self._on_exit)  # another node's stop (early_stop)
        self.early_exits = self._early.release  # the loop, once the early pass's record came
        self._launched = False
        self._ranks_gone = False
        self._local_done = False
        self._finishing = False
        self.faults = FaultGuard(self._fault_stop, lambda: not self._ranks_gone)

    # ----------------------------------------------------------------- what views read

    @property
    def stop(self) -> StopRecord | None:
        return self._policy.stop

    @property
    def cancels(self) -> list[CancelRequest]:
        return self._policy.cancels

    def extend_grace(self, grace: float, why: str) -> bool:
        return self._policy.extend_grace(grace, why)

    def subscribe(self, listener: Listener, urgent: bool = False) -> None:
        (self._events.urgent if urgent else self._events.listeners).append(listener)

    def snapshot(self) -> ev.RunSnapshot:
        stop = self._policy.stopping_event()
        return ev.RunSnapshot(
            self.spec.run_id, self.spec.world_size, self.spec.shown_argv, str(self.spec.run_dir),
            self.started_at, tuple(r.snapshot() for r in self.records.values()), stop,
            self.ended_at, node_rank=self.spec.node_rank, nnodes=self.spec.nnodes,
            gpus=self._gpu.devices, grace=self.grace_in_force)

    @property
    def grace_in_force(self) -> float:
        """The grace a stop gives: the stop's own once it began (it may have grown: a
        preemption's window), else what a stop would give now."""
        return self.stop.grace if self.stop is not None else self.spec.grace

    # ----------------------------------------------------------------- events out

    def emit(self, event: ev.Event) -> None:
        self._events.emit(event)

    def rank_changed(self, record: RankRecord) -> None:
        """Tell views a rank's state when it is no longer what they were last told."""
        state = record.state
        if self._shown[record.rank] is not state:
            self._shown[record.rank] = state
            self.emit(ev.RankStateChanged(record.rank, state, record.collective_wait))

    # ----------------------------------------------------------------- running

    async def run(self) -> None:
        """Launch every rank and return once all have ended and their output is drained."""
        loop = asyncio.get_running_loop()
        self._done: asyncio.Future[None] = loop.create_future()
        self._timers.bind(loop)
        self.faults.bind(loop)
        self._processes = RankProcesses(loop, self._on_exit, self._guardian)
        self._drain = OutputDrain(loop, self.emit, ProgressReader(self.emit), self._check_finished)
        self._sampling = SamplingLoop(loop, self.spec.sample_interval, self._policy.live,
                                      self._on_samples, self._gpu, self._base_env)
        self.started_at = time.time()
        channel = open_channel(loop, self.spec.run_id, self.records, self.emit)
        try:
            if self.hooks.before_launch is not None and self.stop is None:
                await self.hooks.before_launch()
            self.emit(ev.RunStarted(self.spec.run_id, self.spec.world_size, self.spec.shown_argv,
                                    str(self.spec.run_dir), self.started_at,
                                    self.spec.node_rank, self.spec.nnodes))
            self._spawn_all(channel)
            self._held.release(r.rank for r in self.records.values() if r.pid is not None)
            self._sampling.start()
            self.descendants.watch()
            self._check_finished()
            await self._done
        finally:
            self._timers.cancel_all()
            self._stacks.close()
            self._sampling.stop()
            self._drain.close_all()
            if channel is not None:
                channel.close()
            self.ended_at = time.time()
            self.forwards.extend(self._held.close())  # held, never (fully) passed on
        self.emit(ev.RunFinished(self.ended_at))

    def settle(self, spec: LaunchSpec) -> None:
        """Before the launch only: the spec as the join settled it; records rebuilt in place."""
        assert not self._launched
        self.spec = spec
        self.records.clear()
        self.records.update({spec.global_rank(local): rank_record(spec, local)
                             for local in range(spec.nproc_per_node)})
        self._shown = {r: RankState.STARTING for r in self.records}

    def refuse_launch(self, message: str) -> None:
        """The run cannot start (a join refused): no rank is started, the verdict is 1."""
        self.launch_error = message
        with self._signals_first():
            self._policy.launch_failed(message)

    def _spawn_all(self, channel: ChannelServer | None) -> None:
        self._launched = True
        if self.stop is not None:
            return  # cancelled before the launch: no rank is started
        extra = {CHANNEL_ENV: channel.name, STACKS_ENV: str(STACKS_SIGNAL)} if channel else {}
        pipe_size = pipe_capacity(self.spec.nproc_per_node)
        for record in self.records.values():
            env = {**rank_env(self.spec, record.local_rank, self._base_env), **extra}
            argv = rank_argv(self.spec, record.local_rank)
            try:
                with self._drain.logs_for(record) as logs:  # open first: no rank without logs
                    pid, pipes = self._processes.start(record, argv, env, self.spec.cwd, pipe_size)
                self._drain.attach(record, pipes, logs)
            except OSError as exc:
                self.launch_error = f"cannot start rank {record.rank}: {exc.strerror or exc}"
                self._policy.launch_failed(self.launch_error)
                return
            self._sampling.add(record)
            self.emit(ev.RankStarted(record.rank, record.local_rank, pid,
                                     record.started_at or time.time()))
            self.rank_changed(record)

    # ----------------------------------------------------------------- facts in

    def _on_exit(self, record: RankRecord, returncode: int) -> None:
        if self._early.hold(record, returncode):
            return  # it may have died of an early pass whose record is on its way
        early = self._early.pending() if record.early_stop_at is not None else None
        if early is not None:  # the stop whose SIGTERM it may have died of: first
            self.apply_stop(early)
        record.mark_exit(returncode)
        with self._signals_first() as held:
            before = len(held)
            self._policy.rank_ended(record)  # may SIGTERM every peer: before any view work
            caused = held[before:]
            del held[before:]
            # then what the rank wrote last (its pidfd came first: engine/loop.py), its exit,
            # and what the exit caused
            self._drain.read_rest(record)
            held.append(ev.RankExited(record.rank, record.exit_code, record.signal,
                                      record.signalled_first, record.ended_at or time.time()))
            held.extend(caused)
            self.rank_changed(record)
        self._check_finished()

    def _on_samples(self, samples: list[tuple[RankRecord, Sample | None]]) -> None:
        if self._finishing:
            return
        now = time.monotonic()
        for record, sample in samples:
            if not record.alive:
                continue
            apply_sample(record, sample, now, self.spec.sample_interval)
            self.emit(ev.RankSampled(record.rank, dict(record.gauges),
                                     record.output_age(now) or 0.0, record.caught_mask,
                                     record.ignored_mask))
        self._policy.progress_checked(now)
        for request in self._held.deliver(self.records.values(), self.signal_ranks):
            self._forwarded(request)  # held ones, to the ranks that handle them by now

    # ----------------------------------------------------------------- commands

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT, *,
                       source: CancelSource = CancelSource.OPERATOR,
                       sender: Sender | None = None) -> str:
        """Stop every rank gracefully; its effect: "stop", "kill" or "merged" (policy.py)."""
        with self._signals_first():
            return self._policy.cancel(source, origin, sig, sender)

    def kill_now(self, origin: str = "operator",
                 source: CancelSource = CancelSource.OPERATOR) -> None:
        with self._signals_first():
            self._policy.kill_now(source, origin)

    def apply_stop(self, stop: StopRecord, *, ranks_started: bool = True) -> None:
        """Another node's stop record (or a lost node): this node's ranks stop the same way, with
        its grace; a cancel by a signal (scancel: every node's) makes this node's the same cause."""
        self._early.close()
        if stop.source == CancelSource.SIGNAL.value:
            self._policy.note_cause(OUTSIDE_SIGNAL)
        with self._signals_first():
            self._policy.apply_stop(stop)  # a stall: this node's stacks first, as for its own
        self._check_finished()

    def early_stop(self, stop: StopRecord | None) -> bool:
        """Any thread: another node's stop's SIGTERM pass now; None: its record follows."""
        return self._early.signal(stop, self.records.values())

    def apply_kill(self, reason: str) -> None:
        """Another node escalated (a second cancel there): SIGKILL here too."""
        with self._signals_first():
            self._policy.kill_pass(reason)

    def forward(self, sig: int, origin: str | None = "operator",
                source: CancelSource = CancelSource.OPERATOR,
                sender: Sender | None = None) -> None:
        """A signal to every live rank's main process, nothing stopped (held_forwards.py)."""
        origin = origin or f"{signal_name(sig)} to the supervisor"
        request = ForwardRequest(source, origin, sig, time.time(), (), sender=sender)
        done = self._held.forward(request, self._launched, self._policy.live(), self.signal_ranks,
                                  self.spec.scheduler_reaches_ranks)
        if done is not None:
            self._forwarded(done)

    def _forwarded(self, request: ForwardRequest) -> None:
        self.forwards.append(request)
        self.emit(ev.SignalForwarded(request.signal, request.ranks, request.at))

    def request_stacks(self, origin: str = "operator") -> bool:
        """Capture every live rank's stacks now (nothing stops); False while one is under way
        (the result of that one comes) or when no rank is running."""
        return self._stacks.start(self._policy.live(), f"requested by {origin}")

    # ----------------------------------------------------------------- effects (policy)

    def capture_stacks(self, ranks: Sequence[RankRecord], reason: str,
                       done: Callable[[], None]) -> None:
        def then() -> None:
            with self._signals_first():  # the stop's SIGTERMs before any view work
                done()

        self._stacks.start(ranks, reason, then)

    def _signal_for_stacks(self, record: RankRecord, reason: str) -> bool:
        return bool(self.signal_ranks([record], STACKS_SIGNAL, Purpose.STACKS, reason))

    def signal_ranks(self, ranks: Sequence[RankRecord], sig: int, purpose: Purpose,
                     reason: str) -> list[RankRecord]:
        """Signal each rank (its group; its main process for a forward, stacks); who got it."""
        if purpose.stops:  # a stop pass here: none early from now on; what went early counts
            self._early.close()
        early = {r.rank: r.early_stop_at for r in ranks if purpose.stops
                 and sig == signal.SIGTERM and r.early_stop_at is not None}
        with self._signals_first():  # one pass: every rank is signalled before any event
            sent = [r for r in ranks
                    if r.rank in early or self._processes.signal(r, sig, group=purpose.stops)]
            if purpose.stops:  # and what the ranks started outside their groups
                self.descendants.signal(sig)
            for record in sent:
                self._record_signal(record, sig, purpose, reason, early.get(record.rank))
                record.early_stop_at = None  # recorded: signals_sent says it from now on
        return sent

    def _record_signal(self, record: RankRecord, sig: int, purpose: Purpose,
                       reason: str, at: float | None = None) -> None:
        sent = ev.SignalSent(sig, time.time() if at is None else at, reason, purpose)
        record.signals_sent.append(sent)
        self.emit(ev.RankSignalled(record.rank, sig, purpose, reason, sent.at))
        self.rank_changed(record)

    # ----------------------------------------------------------------- the end

    def _check_finished(self) -> None:
        if self._finishing or not self._launched or self._policy.live():
            return
        if self.descendants.stopping(self._check_finished):
            return  # what the ranks left outside their groups is stopping; called back after
        if not self._ranks_gone:
            self._ranks_gone = True
            self._cleanup_groups()
            if self._drain.open:  # every rank ended; stragglers of their groups may hold pipes
                self._timers.start("eof", PIPE_EOF_WAIT, self._drained)
                return
        elif self._drain.open and not self._local_done:
            return
        self._drained()

    def _drained(self) -> None:
        """This node's ranks are over and their output read; the run ends when every node's
        are (other nodes keep this loop, the policy and the signal handlers alive). A signal
        the supervisor got before is acted on first: its cancel is in this node's outcome."""
        if not self._local_done:
            if signal_inbox.unread() and time.monotonic() < SIGNALS_WAIT + max(
                    (r.ended_mono or 0.0) for r in self.records.values()):
                self._timers.start("signals", 0.0, self._drained)  # after the posted ones
                return
            self._local_done = True
            self._timers.cancel("eof")
            self.hooks.local_done()
        if not self._peers.live():
            self._finish()

    def peers_changed(self) -> None:
        """Another node's ranks ended or a node was lost: maybe the run is over."""
        self._check_finished()

    def _cleanup_groups(self) -> None:
        reason = "processes left in the rank's group after it ended"
        for record in self._processes.leftovers(self.records.values()):
            self._record_signal(record, signal.SIGKILL, Purpose.CLEANUP, reason)

    def _finish(self) -> None:
        if self._finishing:
            return
        self._finishing = True
        self._processes.release(self.records.values())
        if not self._done.done():
            self._done.set_result(None)

    def _fault_stop(self, error: SupervisorError) -> None:
        """The supervisor itself failed: stop every rank (docs/signals.md); should even the stop
        fail, SIGKILL every rank group and end the run once the grace has passed."""
        self._timers.start("fault", self.spec.grace + FAULT_WAIT, self._fault_deadline)
        if error.ranks_running and self.stop is None:  # a stop under way goes on
            self.request_cancel(f"forgelm-tui itself ({error.line})", signal.SIGTERM,
                                source=CancelSource.SUPERVISOR)

    def _fault_deadline(self) -> None:
        for record in self._policy.live():
            self._processes.signal(record, signal.SIGKILL, group=True)
        self.descendants.signal(signal.SIGKILL, scan_after=False)  # what the ranks left
        self._finish()

    def signalled(self, sig: int, sender: Sender | None = None) -> None:
        """A stop signal to the supervisor (engine/own_signals.py): a cancel."""
        named = self.hooks.hangup_origin() if sig == signal.SIGHUP else None
        source, origin = named or (CancelSource.SIGNAL, f"{signal_name(sig)} to the supervisor")
        self.request_cancel(origin, sig, source=source, sender=sender)
