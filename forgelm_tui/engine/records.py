"""What the engine knows about each rank and about the run, kept as data.

Keyed by global rank with a node field, so records from other nodes can join later (SPEC §8).
A rank's state is derived from its facts in one place (:attr:`RankRecord.state`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from signal import SIGKILL

from forgelm_tui.engine import ages
from forgelm_tui.engine.events import (
    Gauges,
    ProgressEvidence,
    ProgressSource,
    Purpose,
    RankGpu,
    RankSnapshot,
    RankStacks,
    RankState,
    SignalSent,
)
from forgelm_tui.engine.history import MetricsHistory
from forgelm_tui.engine.logfile import LogLoss
from forgelm_tui.engine.node_summary import RankFacts
from forgelm_tui.engine.signal_inbox import Sender
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.verdict import RankEnding, StopKind

STDERR_TAIL_LINES = 40  # sanitised lines, each <= MAX_LINE_CHARS: <= 80,000 chars a rank


class CancelSource(StrEnum):
    """Who asked for a cancel: the envelope says which source asked what."""

    OPERATOR = "operator"  # a key in the launching TUI
    SIGNAL = "signal"  # SIGINT / SIGTERM / SIGHUP to the supervisor (a scheduler, a shell)
    TERMINAL = "terminal"  # the launching terminal was closed
    VIEWER = "viewer"  # an attached viewer
    NODE = "node"  # another node's supervisor (multi-node)
    SUPERVISOR = "supervisor"  # forgelm-tui itself, after an error of its own (engine/faults.py)


class Evidence(StrEnum):
    """What was just seen of a rank that may show it progressing (``RankRecord.saw``)."""

    STEP = "step"  # its training step changed (channel, or its training progress bar)
    HEARTBEAT = "heartbeat"  # its main thread said it is alive (channel; an advancing loop bar)
    COLLECTIVE = "collective"  # it entered a new collective: its last one completed
    OUTPUT = "output"  # it printed
    CPU = "cpu"  # its CPU time grew


_LEVEL = {Evidence.STEP: ProgressEvidence.STEPS, Evidence.OUTPUT: ProgressEvidence.OUTPUT,
          Evidence.CPU: ProgressEvidence.CPU}
_STRENGTH = {None: 0, ProgressEvidence.CPU: 1, ProgressEvidence.OUTPUT: 2,
             ProgressEvidence.STEPS: 3}


@dataclass(frozen=True)
class StacksHandler:
    """A rank announced faulthandler on ``signum``, writing every thread's stack to ``file``;
    ``thread`` is its main thread's ident, as faulthandler prints it (channel)."""

    signum: int
    thread: int | None
    file: str


@dataclass
class RankRecord:
    rank: int
    local_rank: int
    node_rank: int
    stdout_log: str
    stderr_log: str
    error_file: str
    pid: int | None = None
    started_at: float | None = None
    started_mono: float | None = None
    ended_at: float | None = None
    ended_mono: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    signals_sent: list[SignalSent] = field(default_factory=list)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    last_line: str = ""
    last_output_at: float | None = None
    last_output_mono: float | None = None
    last_progress_mono: float | None = None
    cpu_seconds: float = 0.0
    gauges: Gauges = field(default_factory=dict)  # the last sample's (sampler.Sample.gauges)
    peak_rss_bytes: int = 0
    caught_mask: int = 0  # signals the rank's main process handles (bit N-1: signal N)
    ignored_mask: int = 0  # ...and ignores
    quiet: bool = False
    stalled: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    step: int | None = None
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    history: MetricsHistory = field(default_factory=MetricsHistory)  # bounded (engine/history)
    progress_source: ProgressSource | None = None
    progress_evidence: ProgressEvidence | None = None  # the strongest kind shown so far
    evidence_told: ProgressEvidence | None = None  # ...as views were last told (snapshots)
    channel_seen: bool = False  # it talks on the channel: its output is not read for steps
    loop_bar: tuple[str, int, int] | None = None  # the last other loop bar: label, total, step
    reported_signal: str | None = None  # a stop signal the rank said it received
    reported_mono: float | None = None
    foreign_stop: bool = False  # ...and forgelm-tui had not sent it one (envelope: *_from_outside)
    outside_death: bool = False  # it died of the stop signal a scheduler sent every process
    stopped_step: int | None = None  # the step at which it stopped on an agreement
    stacks_handler: StacksHandler | None = None  # announced: it may get the stacks signal
    stacks: RankStacks | None = None  # where it was stuck, at the last capture
    gpu: RankGpu | None = None  # its last GPU sample (engine/gpu.py); None: no GPU sampling
    gpu_at: float | None = None  # ...taken then (epoch seconds)
    gpu_uuids: list[str] = field(default_factory=list)  # every device it held, in order seen
    peak_gpu_memory_bytes: int | None = None  # the most its processes held on GPUs at once
    log_losses: list[LogLoss] = field(default_factory=list)  # what its logs did not keep
    crash: tuple[str, str] | None = None  # exit 1 of an uncaught exception: (type, message)
    # How many collectives each of its process groups entered, as it last said
    # (rank/collectives.py); empty while it said nothing.
    collectives: dict[str, int] = field(default_factory=dict)
    collectives_over: bool = False  # it destroyed its groups: its last counts are no gap's
    # A group of its stands at different counts (engine/hang.py): since when; and whether it is
    # below a group's highest count (it never entered a collective others wait in).
    gap_since: float | None = None
    behind: bool = False
    last_strong_mono: float | None = None  # its last step, heartbeat or completed collective
    stepped_mono: float | None = None  # when its step last moved
    # When another node's stop's SIGTERM reached it from the inbox thread, before the loop
    # recorded it in signals_sent (engine/early_stop.py); None once recorded, or never sent.
    early_stop_at: float | None = None
    # torch's NCCL flight-recorder pipe and dump file, each + its rank (engine/nccl_dump.py)
    nccl_pipe: str | None = None
    nccl_dump: str | None = None

    @property
    def alive(self) -> bool:
        return self.pid is not None and self.ended_mono is None

    @property
    def collective_wait(self) -> str | None:
        """Quiet in a gap of its collectives: "behind" (its peers wait for it) or "waiting"."""
        if self.gap_since is None or self.state is not RankState.QUIET:
            return None
        return "behind" if self.behind else "waiting"

    @property
    def first_stop(self) -> SignalSent | None:
        """The first stop or kill signal the supervisor sent it, if any."""
        return next((s for s in self.signals_sent if s.purpose.stops), None)

    @property
    def signalled_first(self) -> bool:
        """The supervisor sent it a stop or kill signal (before it ended, if it has); an
        early stop signal the loop has not recorded yet counts (its own report of it, read
        first, is not an outside stop)."""
        return self.first_stop is not None or self.early_stop_at is not None

    @property
    def forwarded_death(self) -> bool:
        """It died of a signal forgelm-tui forwarded to it (SIGUSR1 with no handler)."""
        return self.signal is not None and not self.signalled_first and any(
            s.purpose is Purpose.FORWARD and s.signal == self.signal for s in self.signals_sent)

    @property
    def state(self) -> RankState:
        if self.pid is None:
            return RankState.STARTING
        if self.ended_mono is not None:
            if self.signal is not None:
                return RankState.KILLED
            return RankState.FAILED if self.ending().failed_on_own else RankState.EXITED
        if self.signalled_first:
            return RankState.STOPPING
        return RankState.QUIET if self.quiet else RankState.RUNNING

    def saw(self, evidence: Evidence, now: float) -> bool:
        """One sign of life; True when it counts as progress (the stall and quiet clocks).

        The one place that decides (SPEC §4): a rank's level is the strongest kind of evidence
        it has shown (steps > output > CPU time), and only evidence of that kind counts from
        then on, besides a heartbeat from its main thread and a completed collective of one of
        its process groups (every rank of the group took part), which always count. So a rank that
        reported steps and then spins a core in a hung collective is not progressing, and a
        rank that prints is not kept alive by a busy background thread. Once a rank's step
        reaches its total its training loop is over: its output counts again (never its CPU).
        """
        if evidence is Evidence.STEP:
            self.stepped_mono = now
        level = _LEVEL.get(evidence)
        if level is not None and _STRENGTH[level] > _STRENGTH[self.progress_evidence]:
            self.progress_evidence = level
        counts = (level is None or level is self.progress_evidence
                  or (level is ProgressEvidence.OUTPUT and self.steps_done))
        if counts:
            self.last_progress_mono = now
            if evidence not in (Evidence.OUTPUT, Evidence.CPU):
                self.last_strong_mono = now
        return counts

    def progress_age(self, now: float) -> float:
        """Since its last progress; while it is in a gap of its collectives (engine/hang.py),
        since its last step, heartbeat or completed collective, or the gap's start if it
        progressed since: its output and CPU time do not count while a peer waits for it, or
        it waits for a peer."""
        if self.gap_since is None or self.last_progress_mono is None:
            return ages.progress_age(now, self.last_progress_mono)
        since = max(self.last_strong_mono or 0.0, min(self.gap_since, self.last_progress_mono))
        return ages.progress_age(now, since)

    def output_age(self, now: float) -> float | None:
        return ages.output_age(now, self.last_output_mono, self.started_mono, self.ended_mono)

    def facts(self, now: float) -> RankFacts:
        """What its node's row counts of it (engine/node_summary.py); ``now``: monotonic."""
        stop = next((s.signal for s in reversed(self.signals_sent) if s.purpose.stops), None)
        return RankFacts(
            self.rank, self.state, self.alive, self.step, self.total,
            step_age=None if self.stepped_mono is None else max(0.0, now - self.stepped_mono),
            output_age=self.output_age(now), exit_code=self.exit_code, stop_signal=stop,
            gpu=self.gpu)

    @property
    def steps_done(self) -> bool:
        """It reported steps and its step reached its total."""
        return (self.progress_evidence is ProgressEvidence.STEPS and self.step is not None
                and self.total is not None and self.step >= self.total)

    def mark_started(self, pid: int) -> None:
        now = time.monotonic()
        self.pid, self.started_at, self.started_mono = pid, time.time(), now
        self.last_progress_mono = self.last_strong_mono = now

    def mark_exit(self, returncode: int) -> None:
        self.ended_at = time.time()
        self.ended_mono = time.monotonic()
        if returncode < 0:
            self.signal = -returncode
        else:
            self.exit_code = returncode

    def ending(self) -> RankEnding:
        return RankEnding(
            rank=self.rank,
            exit_code=self.exit_code,
            signal=self.signal,
            ended_mono=self.ended_mono if self.ended_mono is not None else float("inf"),
            signalled_first=self.signalled_first,
            foreign_stop=self.foreign_stop,
            foreign_mono=self.reported_mono if self.reported_mono is not None else float("inf"),
            forwarded_death=self.forwarded_death,
            outside_death=self.outside_death,
            crash=self.crash,
            node_rank=self.node_rank,
        )

    def snapshot(self) -> RankSnapshot:
        return RankSnapshot(
            rank=self.rank, local_rank=self.local_rank, node_rank=self.node_rank, pid=self.pid,
            state=self.state, started_at=self.started_at, ended_at=self.ended_at,
            exit_code=self.exit_code, signal=self.signal, signals=tuple(self.signals_sent),
            last_line=self.last_line, last_output_at=self.last_output_at, step=self.step,
            total=self.total, metrics=dict(self.metrics), progress_source=self.progress_source,
            gauges=dict(self.gauges),
            caught_mask=self.caught_mask, ignored_mask=self.ignored_mask,
            progress_evidence=self.evidence_told, gpu=self.gpu,
            metrics_history=self.history.snapshot(),
        )


@dataclass(frozen=True)
class CancelRequest:
    source: CancelSource
    origin: str  # in words: "operator", "SIGTERM to the supervisor", "terminal closed"...
    signal: int  # the signal it stands for: SIGINT for the operator's Ctrl+C
    at: float
    effect: str  # "stop" (began the stop), "kill" (escalated), "merged" (same cause again)
    sender: Sender | None = None  # a signal's sender, when known (engine/signal_inbox.py)


@dataclass(frozen=True)
class ForwardRequest:
    """A signal passed to every rank without stopping anything, and who asked for it."""

    source: CancelSource
    origin: str
    signal: int
    at: float
    ranks: tuple[int, ...]  # the ranks it reached
    held_since: float | None = None  # it came before any rank started: held until they did
    sender: Sender | None = None  # a signal's sender, when known (engine/signal_inbox.py)
    by_scheduler: bool = False  # the scheduler sent it to every rank itself: not sent again


@dataclass
class StopRecord:
    kind: StopKind
    reason: str
    origin: str  # "operator", "SIGTERM to the supervisor", "failure", "drain", "stall"...
    signal: int | None  # the signal that caused it (a cancel's, a forwarded one)
    at: float
    deadline_mono: float
    killed_at: float | None = None  # when the SIGKILL pass ran, if it did
    grace: float = 30.0
    origin_rank: int | None = None  # the rank whose failure began it
    origin_node: int = 0  # the node where it began (multi-node: another node's record)
    lost_node: int | None = None  # a node_lost stop: which node
    source: str | None = None  # a cancel's CancelSource value
    stacks_delay: float | None = None  # a stall stop: how long it waited for the ranks' stacks
    grace_from: str | None = None  # why the grace was extended during the stop, if it was


def rank_record(spec: LaunchSpec, local_rank: int) -> RankRecord:
    """A rank's record before it starts: its global rank and where its logs go."""
    rank = spec.global_rank(local_rank)
    return RankRecord(rank=rank, local_rank=local_rank, node_rank=spec.node_rank,
                      stdout_log=str(spec.log_file(rank, "stdout")),
                      stderr_log=str(spec.log_file(rank, "stderr")),
                      error_file=str(spec.error_file(rank)))


class DescendantEnd(StrEnum):
    """How a process a rank left outside its process group ended (envelope ``descendants``)."""

    EXITED = "exited"  # gone before the supervisor signalled it
    SIGTERM = "sigterm"  # gone after the supervisor's SIGTERM
    SIGKILL = "sigkill"  # gone after the supervisor's SIGKILL
    GONE = "gone"  # gone, how unknown (it could not be signalled)


@dataclass
class DescendantRecord:
    """A process a rank started that left the rank's process group (a daemon, ``setsid``)."""

    pid: int
    start_ticks: int  # its start time in /proc: the same pid later is another process
    rank: int | None  # from its RANK variable, when readable
    command: str  # argv[0]'s basename and a short command line
    found_by: str  # "environment" (the supervisor's token) or "adopted" (an orphan of ours)
    seen_at: float
    signals: list[tuple[int, float]] = field(default_factory=list)  # what was sent, when
    denied: bool = False  # a signal to it was refused (another user's process)
    ended: DescendantEnd | None = None  # None: not seen to end (yet)
    ended_at: float | None = None

    def mark_gone(self) -> None:
        if self.ended is not None:
            return
        self.ended_at = time.time()
        last = self.signals[-1][0] if self.signals else None
        if last is None:
            self.ended = DescendantEnd.GONE if self.denied else DescendantEnd.EXITED
        elif self.denied:
            self.ended = DescendantEnd.GONE
        else:
            self.ended = (DescendantEnd.SIGKILL if last == SIGKILL
                          else DescendantEnd.SIGTERM)
