"""What the engine knows about each rank and about the run, kept as data.

Keyed by global rank with a node field, so records from other nodes can join later (SPEC §8).
A rank's state is derived from its facts in one place (:attr:`RankRecord.state`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from forgelm_tui.engine.events import (
    ProgressSource,
    Purpose,
    RankSnapshot,
    RankState,
    SignalSent,
)
from forgelm_tui.verdict import RankEnding, StopKind

STDERR_TAIL_LINES = 40  # sanitised lines, each <= MAX_LINE_CHARS: <= 80,000 chars a rank


class CancelSource(StrEnum):
    """Who asked for a cancel: the envelope says which source asked what."""

    OPERATOR = "operator"  # a key in the launching TUI
    SIGNAL = "signal"  # SIGINT / SIGTERM / SIGHUP to the supervisor (a scheduler, a shell)
    TERMINAL = "terminal"  # the launching terminal was closed
    VIEWER = "viewer"  # an attached viewer
    NODE = "node"  # another node's supervisor (multi-node)


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
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    peak_rss_bytes: int = 0
    children: int = 0
    caught_mask: int = 0  # signals the rank's main process handles (bit N-1: signal N)
    ignored_mask: int = 0  # ...and ignores
    quiet: bool = False
    stalled: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    step: int | None = None
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    progress_source: ProgressSource | None = None
    reported_signal: str | None = None  # a stop signal the rank said it received
    reported_mono: float | None = None
    foreign_stop: bool = False  # ...and forgelm-tui had not sent it one (envelope: *_from_outside)
    stopped_step: int | None = None  # the step at which it stopped on an agreement

    @property
    def alive(self) -> bool:
        return self.pid is not None and self.ended_mono is None

    @property
    def signalled_first(self) -> bool:
        """The supervisor sent it a stop or kill signal (before it ended, if it has)."""
        return any(s.purpose.stops for s in self.signals_sent)

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

    def mark_started(self, pid: int) -> None:
        now = time.monotonic()
        self.pid, self.started_at, self.started_mono = pid, time.time(), now
        self.last_progress_mono = now

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
        )

    def snapshot(self) -> RankSnapshot:
        return RankSnapshot(
            rank=self.rank, local_rank=self.local_rank, node_rank=self.node_rank, pid=self.pid,
            state=self.state, started_at=self.started_at, ended_at=self.ended_at,
            exit_code=self.exit_code, signal=self.signal, signals=tuple(self.signals_sent),
            last_line=self.last_line, last_output_at=self.last_output_at, step=self.step,
            total=self.total, metrics=dict(self.metrics), progress_source=self.progress_source,
            cpu_percent=self.cpu_percent, rss_bytes=self.rss_bytes, children=self.children,
            caught_mask=self.caught_mask, ignored_mask=self.ignored_mask,
        )


@dataclass(frozen=True)
class CancelRequest:
    source: CancelSource
    origin: str  # in words: "operator", "SIGTERM to the supervisor", "terminal closed"...
    signal: int  # the signal it stands for: SIGINT for the operator's Ctrl+C
    at: float
    effect: str  # "stop" (began the stop), "kill" (escalated), "merged" (same cause again)


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
