"""What the engine knows about each rank and about the run, kept as data.

Keyed by global rank with a node field, so records from other nodes can join later (SPEC §8).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from forgelm_tui.verdict import OUTCOME_CODES, RankOutcome, StopKind

STDERR_TAIL_LINES = 40


class RankState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    QUIET = "quiet"
    STOPPING = "stopping"
    EXITED = "exited"
    KILLED = "killed"  # ended by a signal
    FAILED = "failed"  # ended on its own with a code outside the outcome set


class Purpose(StrEnum):
    """Why a signal was sent to a rank."""

    STOP = "stop"  # SIGTERM of a coordinated stop
    KILL = "kill"  # SIGKILL at the grace deadline or on a second cancel
    FORWARD = "forward"  # passed on without stopping anything (SIGUSR1 / SIGUSR2)
    CLEANUP = "cleanup"  # SIGKILL to processes left in the rank's group after it exited


@dataclass(frozen=True)
class SignalSent:
    signal: int
    at: float  # epoch seconds
    reason: str
    purpose: Purpose


@dataclass
class RankRecord:
    rank: int
    local_rank: int
    node_rank: int
    stdout_log: str
    stderr_log: str
    error_file: str
    pid: int | None = None
    state: RankState = RankState.STARTING
    started_at: float | None = None
    started_mono: float | None = None
    ended_at: float | None = None
    ended_mono: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    signals_sent: list[SignalSent] = field(default_factory=list)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    last_line: str = ""
    last_output_mono: float | None = None
    last_progress_mono: float | None = None
    cpu_seconds: float = 0.0
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    peak_rss_bytes: int = 0
    children: int = 0
    stalled: bool = False
    stopped_from_outside: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    step: int | None = None
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    progress_source: str | None = None  # "channel" or "output"
    reported_signal: str | None = None  # a stop signal the rank said it received
    reported_at: float | None = None  # monotonic
    stopped_step: int | None = None  # the step at which it stopped on an agreement

    @property
    def alive(self) -> bool:
        return self.pid is not None and self.ended_mono is None

    @property
    def signalled_first(self) -> bool:
        return any(s.purpose in (Purpose.STOP, Purpose.KILL) for s in self.signals_sent)

    def mark_exit(self, returncode: int) -> None:
        self.ended_at = time.time()
        self.ended_mono = time.monotonic()
        if returncode < 0:
            self.signal = -returncode
            self.state = RankState.KILLED
        else:
            self.exit_code = returncode
            failed = returncode not in OUTCOME_CODES and not self.signalled_first
            self.state = RankState.FAILED if failed else RankState.EXITED

    def outcome(self) -> RankOutcome:
        return RankOutcome(
            rank=self.rank,
            exit_code=self.exit_code,
            signal=self.signal,
            ended_at=self.ended_mono if self.ended_mono is not None else float("inf"),
            signalled_first=self.signalled_first,
            stopped_from_outside=self.stopped_from_outside,
            outside_at=self.reported_at if self.reported_at is not None else float("inf"),
        )


@dataclass(frozen=True)
class CancelRequest:
    origin: str  # "operator", "SIGTERM to supervisor", ...
    signal: int  # the signal it stands for: SIGINT for the operator's Ctrl+C
    at: float


@dataclass
class StopRecord:
    kind: StopKind
    reason: str
    origin: str  # "operator", "SIGTERM to supervisor", "rank 1 failed", ...
    signal: int | None  # the signal that caused a cancel
    at: float
    deadline_mono: float
    killed_at: float | None = None  # when the SIGKILL pass ran, if it did
