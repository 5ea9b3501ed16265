"""What the engine tells views: frozen facts, named in the past tense.

Times are wall-clock epoch seconds (``at``) unless named ``*_mono`` (``time.monotonic``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from forgelm_tui.engine.sanitize import sanitize_block, sanitize_line

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    world_size: int
    argv: tuple[str, ...]
    run_dir: str
    at: float


@dataclass(frozen=True)
class RankStarted:
    rank: int
    local_rank: int
    pid: int
    at: float


@dataclass(frozen=True)
class RankOutput:
    """One read chunk of a rank's stream: its complete lines, sanitised when first asked for.

    ``raw`` is the lines as the rank wrote them, joined by newlines (no final one). A view that
    shows every line (``--no-tui``) reads ``lines``; one that shows a few of a flood (the TUI)
    reads ``tail(n)`` and never pays for the rest.
    """

    rank: int
    stream: Stream
    raw: bytes

    @classmethod
    def of(cls, rank: int, stream: Stream, lines: Sequence[str]) -> RankOutput:
        """An event from lines already in hand (scripted runs, tests)."""
        if not lines:
            raise ValueError("an output event has at least one line")
        return cls(rank, stream, "\n".join(lines).encode())

    @cached_property
    def count(self) -> int:
        """Lines in the chunk, counted without decoding it."""
        return self.raw.count(b"\n") + 1

    @cached_property
    def lines(self) -> tuple[str, ...]:
        return tuple(sanitize_block(self.raw))

    def tail(self, n: int) -> tuple[str, ...]:
        """The last ``n`` lines, sanitised; only those are decoded."""
        if n <= 0:
            return ()
        if n >= self.count or "lines" in self.__dict__:
            return self.lines[-n:]
        return tuple(sanitize_line(part.decode("utf-8", "replace"))
                     for part in self.raw.rsplit(b"\n", n)[1:])

    @cached_property
    def last_line(self) -> str:
        return self.tail(1)[0]


@dataclass(frozen=True)
class RankSampled:
    rank: int
    cpu_percent: float
    rss_bytes: int
    children: int
    output_age: float  # seconds since the rank last printed anything
    quiet: bool  # no output, CPU or heartbeat progress for the quiet threshold


@dataclass(frozen=True)
class RankSignalled:
    rank: int
    signal: int
    reason: str
    at: float


@dataclass(frozen=True)
class RankExited:
    rank: int
    exit_code: int | None
    signal: int | None
    signalled_first: bool
    at: float


@dataclass(frozen=True)
class RunStopping:
    kind: str  # StopKind value
    reason: str
    grace: float
    deadline_mono: float
    live_ranks: tuple[int, ...]
    at: float


@dataclass(frozen=True)
class StopCountdown:
    """Sent about once a second while a stop waits for ranks to end."""

    seconds_left: float
    live_ranks: tuple[int, ...]


@dataclass(frozen=True)
class RunStalled:
    seconds: float
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class SignalForwarded:
    signal: int
    ranks: tuple[int, ...]
    at: float


@dataclass(frozen=True)
class RankProgressed:
    """A rank said (or its output showed) how far it is."""

    rank: int
    step: int | None
    total: int | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class RankReportedStop:
    """A rank said it received a stop signal, or that it stopped at an agreed step."""

    rank: int
    signal: str | None
    outside: bool  # the supervisor had not signalled it: the signal came from elsewhere
    step: int | None


@dataclass(frozen=True)
class RunFinished:
    at: float


Event = (
    RunStarted
    | RankStarted
    | RankOutput
    | RankSampled
    | RankSignalled
    | RankExited
    | RunStopping
    | StopCountdown
    | RunStalled
    | SignalForwarded
    | RankProgressed
    | RankReportedStop
    | RunFinished
)
