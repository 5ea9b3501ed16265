"""The supervisor: launches the ranks, drains their output, watches them, stops them together."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.channel import ChannelServer, Message
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.progress_lines import (
    LIGHTNING_SIGTERM,
    lines_with,
    parse_loss,
    parse_step,
)
from forgelm_tui.engine.records import (
    STDERR_TAIL_LINES,
    CancelRequest,
    Purpose,
    RankRecord,
    RankState,
    SignalSent,
    StopRecord,
)
from forgelm_tui.engine.sampler import IDLE_CPU_FRACTION, RankSampler, Sample
from forgelm_tui.engine.sanitize import LineSplitter
from forgelm_tui.engine.spawn import (
    group_alive,
    pipe_capacity,
    signal_group,
    signal_process,
    spawn_rank,
)
from forgelm_tui.engine.spec import LaunchSpec, rank_env
from forgelm_tui.verdict import StopKind

Listener = Callable[[ev.Event], None]
CHANNEL_ENV = "FORGELM_TUI_CHANNEL"  # read by forgelm_tui.rank.channel
STOP_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PIPE_EOF_WAIT = 2.0  # after the last rank ends, how long a stray holder may keep its pipes
READ_CHUNK = 1 << 16


class Supervisor:
    """Runs one node's ranks from a :class:`LaunchSpec` until every rank has ended.

    Views subscribe to events and call the commands :meth:`request_cancel`, :meth:`kill_now`
    and :meth:`forward`; policy (fail fast, grace, drain, stall) lives here.
    """

    def __init__(
        self,
        spec: LaunchSpec,
        *,
        guardian: Guardian | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.records: dict[int, RankRecord] = {}
        for local_rank in range(spec.nproc_per_node):
            rank = spec.global_rank(local_rank)
            self.records[rank] = RankRecord(
                rank=rank,
                local_rank=local_rank,
                node_rank=spec.node_rank,
                stdout_log=str(spec.log_file(rank, "stdout")),
                stderr_log=str(spec.log_file(rank, "stderr")),
                error_file=str(spec.error_file(rank)),
            )
        self.stop: StopRecord | None = None
        self.cancels: list[CancelRequest] = []
        self.launch_error: str | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._guardian = guardian
        self._listeners: list[Listener] = []
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._samplers: dict[int, RankSampler] = {}
        self._open_fds: set[int] = set()
        self._log_fds: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[None] | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._finishing = False
        self._channel: ChannelServer | None = None
        self._held: list[ev.Event] | None = None
        self._sampling = False

    # ----------------------------------------------------------------- subscription

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _emit(self, event: ev.Event) -> None:
        if self._held is not None:
            self._held.append(event)
            return
        for listener in self._listeners:
            listener(event)

    @contextlib.contextmanager
    def _signals_first(self) -> Iterator[None]:
        """Hold events while signals go out: no view work delays a peer's SIGTERM."""
        if self._held is not None:
            yield
            return
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            for event in held:
                self._emit(event)

    # ----------------------------------------------------------------- running

    async def run(self, *, handle_signals: bool = True) -> None:
        """Launch every rank and return once all have ended and their output is drained."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._done = loop.create_future()
        self.started_at = time.time()
        if handle_signals:
            self._install_signal_handlers()
        self._open_channel(loop)
        try:
            self._emit(
                ev.RunStarted(
                    self.spec.run_id,
                    self.spec.world_size,
                    self.spec.argv,
                    str(self.spec.run_dir),
                    self.started_at,
                )
            )
            self._spawn_all()
            self._schedule("sample", self.spec.sample_interval, self._sample)
            self._check_finished()
            await self._done
        finally:
            if handle_signals:
                self._remove_signal_handlers()
            for timer in self._timers.values():
                timer.cancel()
            self._close_all_fds()
            if self._channel is not None:
                self._channel.close()
            self.ended_at = time.time()
        self._emit(ev.RunFinished(self.ended_at))

    def _spawn_all(self) -> None:
        for record in self.records.values():
            try:
                self._spawn(record)
            except OSError as exc:
                self.launch_error = f"cannot start rank {record.rank}: {exc.strerror or exc}"
                self._begin_stop(StopKind.FAILURE, self.launch_error, "launch")
                return

    def _spawn(self, record: RankRecord) -> None:
        assert self._loop is not None
        env = rank_env(self.spec, record.local_rank, self._base_env)
        if self._channel is not None:
            env[CHANNEL_ENV] = self._channel.name
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        out_log = os.open(record.stdout_log, flags, 0o644)
        err_log = os.open(record.stderr_log, flags, 0o644)
        try:
            proc = spawn_rank(self.spec.argv, env, self.spec.cwd,
                              pipe_size=pipe_capacity(self.spec.nproc_per_node))
        except OSError:
            os.close(out_log)
            os.close(err_log)
            raise
        if self._guardian is not None:
            self._guardian.watch(proc.pid)
        now = time.monotonic()
        record.pid = proc.pid
        record.started_at = time.time()
        record.started_mono = now
        record.last_progress_mono = now
        record.state = RankState.RUNNING
        self._procs[record.rank] = proc
        self._samplers[record.rank] = RankSampler(proc.pid)
        assert proc.stdout is not None and proc.stderr is not None
        streams: tuple[tuple[IO[bytes], int, ev.Stream], ...] = (
            (proc.stdout, out_log, "stdout"),
            (proc.stderr, err_log, "stderr"),
        )
        for pipe, log_fd, stream in streams:
            fd = pipe.fileno()
            self._open_fds.add(fd)
            self._log_fds[fd] = log_fd
            splitter = LineSplitter()
            self._loop.add_reader(fd, self._on_readable, record, stream, fd, splitter)
        self._watch_exit(record, proc)
        self._emit(ev.RankStarted(record.rank, record.local_rank, proc.pid, record.started_at))

    def _watch_exit(self, record: RankRecord, proc: subprocess.Popen[bytes]) -> None:
        """Exit as an event: a pidfd becomes readable when the process ends."""
        assert self._loop is not None
        loop = self._loop
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            # No pidfd (old kernel): a thread blocked in wait() is still an event, not a poll.
            def wait() -> None:
                proc.wait()
                loop.call_soon_threadsafe(self._on_exit, record, None)

            threading.Thread(target=wait, name=f"wait-rank-{record.rank}", daemon=True).start()
            return
        loop.add_reader(pidfd, self._on_exit, record, pidfd)

    # ----------------------------------------------------------------- output drain

    def _on_readable(
        self, record: RankRecord, stream: ev.Stream, fd: int, splitter: LineSplitter
    ) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_stream(fd)
            self._deliver(record, stream, splitter.flush())
            self._check_finished()
            return
        _write_all(self._log_fds[fd], data)
        if stream == "stdout":
            record.stdout_bytes += len(data)
        else:
            record.stderr_bytes += len(data)
        now = time.monotonic()
        record.last_output_mono = now
        record.last_progress_mono = now
        self._deliver(record, stream, splitter.split(data))
        if b"\r" in data:
            partial = splitter.partial()
            if partial:
                self._read_progress(record, partial.encode())

    def _deliver(self, record: RankRecord, stream: ev.Stream, block: bytes | None) -> None:
        """One event for the chunk's complete lines. Nothing here is per line: a view that
        wants every line sanitised asks the event for them (see RankOutput)."""
        if block is None:
            return
        output = ev.RankOutput(record.rank, stream, block)
        record.last_line = output.last_line
        if stream == "stderr":
            record.stderr_tail.extend(output.tail(STDERR_TAIL_LINES))
        self._emit(output)
        self._read_progress(record, block)

    def _read_progress(self, record: RankRecord, raw: bytes) -> None:
        """Progress and stop notices from the output of ranks that do not use the channel."""
        if LIGHTNING_SIGTERM in raw:  # C-speed scans of the chunk before any per-line work
            self._reported_stop(record, "SIGTERM", None)
        if record.progress_source == "channel" or not (b"loss" in raw or b"/" in raw):
            return
        step = next(filter(None, map(parse_step, lines_with(raw, b"/", b"[", b"|"))), None)
        loss = next((v for v in map(parse_loss, lines_with(raw, b"loss")) if v is not None),
                    None)
        if step is None and loss is None:
            return
        record.progress_source = "output"
        if step is not None:
            record.step, record.total = step
        if loss is not None:
            record.metrics = {"loss": loss}
        self._emit(ev.RankProgressed(record.rank, record.step, record.total, dict(record.metrics)))

    # ----------------------------------------------------------------- channel

    def _open_channel(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._channel = ChannelServer(self.spec.run_id)
        except OSError:
            self._channel = None  # progress is optional; the run goes on without it
            return
        self._channel.start(loop, self._on_message)

    def _on_message(self, message: Message) -> None:
        record = self.records.get(message["rank"])
        if record is None or record.pid is None:
            return
        kind = message.get("kind")
        record.last_progress_mono = time.monotonic()  # any message is a heartbeat
        if kind == "progress":
            record.progress_source = "channel"
            step, total = message.get("step"), message.get("total")
            record.step = step if isinstance(step, int) else record.step
            record.total = total if isinstance(total, int) else record.total
            metrics = message.get("metrics")
            if isinstance(metrics, dict):
                record.metrics = {str(k): v for k, v in metrics.items()
                                  if isinstance(v, int | float)}
            self._emit(ev.RankProgressed(record.rank, record.step, record.total,
                                         dict(record.metrics)))
        elif kind == "stop_requested":
            self._reported_stop(record, str(message.get("signal") or "SIGTERM"), None)
        elif kind == "stopped":
            step = message.get("step")
            record.stopped_step = step if isinstance(step, int) else None
            if isinstance(step, int):
                record.step = step
            self._emit(ev.RankReportedStop(record.rank, record.reported_signal,
                                           record.stopped_from_outside, record.stopped_step))

    def _reported_stop(self, record: RankRecord, signal_name: str, step: int | None) -> None:
        """A rank received a stop signal; from outside unless the supervisor had sent one."""
        if record.reported_signal is not None:
            return
        record.reported_signal = signal_name
        record.reported_at = time.monotonic()
        record.stopped_from_outside = not record.signalled_first
        self._emit(ev.RankReportedStop(record.rank, signal_name, record.stopped_from_outside,
                                       step))

    def _close_stream(self, fd: int) -> None:
        assert self._loop is not None
        self._loop.remove_reader(fd)
        self._open_fds.discard(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        log_fd = self._log_fds.pop(fd, None)
        if log_fd is not None:
            os.close(log_fd)

    def _close_all_fds(self) -> None:
        for fd in list(self._open_fds):
            self._close_stream(fd)
        for proc in self._procs.values():
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()

    # ----------------------------------------------------------------- exits

    def _on_exit(self, record: RankRecord, pidfd: int | None) -> None:
        assert self._loop is not None
        if pidfd is not None:
            self._loop.remove_reader(pidfd)
            os.close(pidfd)
        proc = self._procs[record.rank]
        returncode = proc.poll()
        if returncode is None:
            returncode = proc.wait()
        record.mark_exit(returncode)
        exited = ev.RankExited(
            record.rank, record.exit_code, record.signal, record.signalled_first, time.time()
        )
        with self._signals_first():
            self._apply_exit_policy(record)  # may SIGTERM every peer: before any view work
            self._held_first(exited)
        self._check_finished()

    def _held_first(self, event: ev.Event) -> None:
        """Put ``event`` before what the policy emitted (the exit is what caused it)."""
        if self._held is not None:
            self._held.insert(0, event)
        else:
            self._emit(event)

    def _apply_exit_policy(self, record: RankRecord) -> None:
        if self.stop is not None:
            return
        outcome = record.outcome()
        if outcome.failed_on_own:
            how = (
                f"killed by {signal.Signals(record.signal).name}"
                if record.signal
                else f"exit {record.exit_code}"
            )
            self._begin_stop(StopKind.FAILURE, f"rank {record.rank} failed ({how})", "failure")
        elif record.rank == 0 and self._live():
            self._schedule("drain", self.spec.drain, self._drain_ended)

    def _drain_ended(self) -> None:
        if self._live() and self.stop is None:
            reason = f"drain window of {self.spec.drain:g} s ended after rank 0 finished"
            self._begin_stop(StopKind.DRAIN, reason, "drain")

    def _live(self) -> list[RankRecord]:
        return [r for r in self.records.values() if r.alive]

    def _check_finished(self) -> None:
        if self._finishing or self._live() or self._any_unstarted_pending():
            return
        if self._open_fds:
            # Every rank ended; stragglers of their groups may still hold the pipes.
            self._cleanup_groups()
            self._schedule("eof", PIPE_EOF_WAIT, self._finish)
            return
        self._cleanup_groups()
        self._finish()

    def _any_unstarted_pending(self) -> bool:
        if self.launch_error is not None:
            return False
        return any(r.pid is None for r in self.records.values())

    def _cleanup_groups(self) -> None:
        """SIGKILL whatever is left in an ended rank's process group (orphaned children)."""
        for record in self.records.values():
            if record.pid is None or not group_alive(record.pid):
                continue
            if signal_group(record.pid, signal.SIGKILL):
                reason = "processes left in the rank's group after it ended"
                self._record_signal(record, signal.SIGKILL, reason, Purpose.CLEANUP)

    def _finish(self) -> None:
        if self._finishing:
            return
        self._finishing = True
        if self._guardian is not None:
            for record in self.records.values():
                if record.pid is not None:
                    self._guardian.forget(record.pid)
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    # ----------------------------------------------------------------- stopping

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT) -> None:
        """Stop every rank gracefully; a second request kills at once."""
        self.cancels.append(CancelRequest(origin, sig, time.time()))
        if self.stop is None:
            self._begin_stop(StopKind.CANCEL, f"cancelled by {origin}", origin, sig)
        else:
            self._kill_pass(f"second cancel by {origin}: kill now")

    def kill_now(self, origin: str = "operator") -> None:
        """SIGKILL every live rank now (starting a stop first when none is under way)."""
        if self.stop is None:
            self.cancels.append(CancelRequest(origin, signal.SIGKILL, time.time()))
            self._begin_stop(StopKind.CANCEL, f"killed by {origin}", origin, signal.SIGKILL)
        self._kill_pass(f"kill now by {origin}")

    def forward(self, sig: int) -> None:
        """Pass a signal to every live rank without stopping anything."""
        sent = []
        reason = f"{signal.Signals(sig).name} forwarded from the supervisor"
        for record in self._live():
            assert record.pid is not None
            if signal_process(record.pid, sig):
                self._record_signal(record, sig, reason, Purpose.FORWARD)
                sent.append(record.rank)
        self._emit(ev.SignalForwarded(sig, tuple(sent), time.time()))

    def _begin_stop(
        self, kind: StopKind, reason: str, origin: str, sig: int | None = None
    ) -> None:
        if self.stop is not None:
            return
        assert self._loop is not None
        deadline = self._loop.time() + self.spec.grace
        self.stop = StopRecord(kind, reason, origin, sig, time.time(), deadline)
        self._cancel_timer("drain")
        live = self._live()
        with self._signals_first():  # one pass: every group gets SIGTERM before anything else
            for record in live:
                assert record.pid is not None
                record.state = RankState.STOPPING
                if signal_group(record.pid, signal.SIGTERM):
                    self._record_signal(record, signal.SIGTERM, reason, Purpose.STOP)
        self._emit(
            ev.RunStopping(
                kind.value,
                reason,
                self.spec.grace,
                deadline,
                tuple(r.rank for r in live),
                self.stop.at,
            )
        )
        if live:
            self._timers["kill"] = self._loop.call_at(
                deadline, self._kill_pass, f"grace of {self.spec.grace:g} s ended"
            )
            self._schedule("countdown", 1.0, self._countdown)
        self._check_finished()

    def _kill_pass(self, reason: str) -> None:
        self._cancel_timer("kill")
        if self.stop is not None and self.stop.killed_at is None and self._live():
            self.stop.killed_at = time.time()
        with self._signals_first():
            for record in self._live():
                assert record.pid is not None
                if signal_group(record.pid, signal.SIGKILL):
                    self._record_signal(record, signal.SIGKILL, reason, Purpose.KILL)

    def _countdown(self) -> None:
        assert self._loop is not None and self.stop is not None
        live = self._live()
        if not live:
            return
        left = max(0.0, self.stop.deadline_mono - self._loop.time())
        self._emit(ev.StopCountdown(left, tuple(r.rank for r in live)))
        self._schedule("countdown", 1.0, self._countdown)

    def _record_signal(self, record: RankRecord, sig: int, reason: str, purpose: Purpose) -> None:
        sent = SignalSent(sig, time.time(), reason, purpose)
        record.signals_sent.append(sent)
        self._emit(ev.RankSignalled(record.rank, sig, f"{purpose.value}: {reason}", sent.at))

    # ----------------------------------------------------------------- sampling and stalls

    def _sample(self) -> None:
        """psutil reads run in a worker thread: a process-tree walk never delays a stop."""
        assert self._loop is not None
        self._schedule("sample", self.spec.sample_interval, self._sample)
        if self._sampling:
            return
        self._sampling = True
        samplers = [(r, self._samplers.get(r.rank)) for r in self._live()]
        future = self._loop.run_in_executor(
            None, lambda: [(r, s.sample() if s else None) for r, s in samplers]
        )
        future.add_done_callback(self._sampled)

    def _sampled(self, future: asyncio.Future[list[tuple[RankRecord, Sample | None]]]) -> None:
        self._sampling = False
        if future.cancelled() or future.exception() is not None or self._finishing:
            return
        now = time.monotonic()
        interval = self.spec.sample_interval
        for record, sample in future.result():
            if record.alive:
                self._sample_rank(record, sample, now, interval)
        self._check_stall(now)

    def _sample_rank(
        self, record: RankRecord, sample: Sample | None, now: float, interval: float
    ) -> None:
        if sample is not None:
            if sample.cpu_seconds - record.cpu_seconds > IDLE_CPU_FRACTION * interval:
                record.last_progress_mono = now
            record.cpu_seconds = sample.cpu_seconds
            record.cpu_percent = sample.cpu_percent
            record.rss_bytes = sample.rss_bytes
            record.peak_rss_bytes = max(record.peak_rss_bytes, sample.rss_bytes)
            if sample.children is not None:
                record.children = sample.children
        idle = now - (record.last_progress_mono or now)
        quiet = idle >= min(self.spec.quiet_after, self.spec.stall_timeout or float("inf"))
        if record.state in (RankState.RUNNING, RankState.QUIET):
            record.state = RankState.QUIET if quiet else RankState.RUNNING
        output_age = now - (record.last_output_mono or record.started_mono or now)
        self._emit(
            ev.RankSampled(
                record.rank,
                record.cpu_percent,
                record.rss_bytes,
                record.children,
                output_age,
                quiet,
            )
        )

    def _check_stall(self, now: float) -> None:
        timeout = self.spec.stall_timeout
        live = self._live()
        if timeout is None or self.stop is not None or not live:
            return
        idle = [now - (r.last_progress_mono or now) for r in live]
        if min(idle) < timeout:
            return
        for record in live:
            record.stalled = True
        ranks = tuple(r.rank for r in live)
        self._emit(ev.RunStalled(timeout, ranks))
        reason = f"stalled: no rank made progress for {timeout:g} s"
        self._begin_stop(StopKind.STALL, reason, "stall")

    # ----------------------------------------------------------------- plumbing

    def _schedule(self, name: str, delay: float, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        self._cancel_timer(name)
        self._timers[name] = self._loop.call_later(delay, callback)

    def _cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def _install_signal_handlers(self) -> None:
        assert self._loop is not None
        for sig in STOP_SIGNALS:
            name = signal.Signals(sig).name
            self._loop.add_signal_handler(
                sig, self.request_cancel, f"{name} to the supervisor", sig
            )
        for sig in self.spec.forward_signals:
            self._loop.add_signal_handler(sig, self.forward, sig)

    def _remove_signal_handlers(self) -> None:
        assert self._loop is not None
        for sig in (*STOP_SIGNALS, *self.spec.forward_signals):
            self._loop.remove_signal_handler(sig)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]

