"""What the engine tells views: frozen facts, named in the past tense, and the run snapshot.

Every event is plain data (enums, numbers, strings, bytes, tuples, nested frozen dataclasses)
and goes through JSON and back without loss (``engine.codec``), so it can cross a socket to an
attached viewer or another node. Times named ``at`` are wall-clock epoch seconds; nothing here
holds a monotonic time (it means nothing in another process).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from forgelm_tui.engine.gpu_events import GpuDevice as GpuDevice  # re-exported: every event
from forgelm_tui.engine.gpu_events import GpuSampled as GpuSampled  # is an events.X
from forgelm_tui.engine.gpu_events import RankGpu as RankGpu
from forgelm_tui.engine.history import MetricSeries
from forgelm_tui.engine.node_summary import NodeSummary as NodeSummary  # re-exported
from forgelm_tui.engine.sanitize import sanitize_block, sanitize_line
from forgelm_tui.engine.states import ProgressEvidence as ProgressEvidence  # re-exported
from forgelm_tui.engine.states import ProgressSource as ProgressSource
from forgelm_tui.engine.states import Purpose as Purpose
from forgelm_tui.engine.states import RankState as RankState
from forgelm_tui.engine.states import Stream as Stream
from forgelm_tui.verdict import StopKind, Verdict

# A rank's sampled values by the rank table's column key ("cpu", "rss"...): the sampler names
# them, the table shows them, nothing between knows which; floats, to cross the wire (codec).
Gauges = dict[str, float]


@dataclass(frozen=True)
class SignalSent:
    signal: int
    at: float
    reason: str
    purpose: Purpose


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    world_size: int
    argv: tuple[str, ...]
    run_dir: str
    at: float
    node_rank: int = 0  # multi-node: this node (its ranks' rows); other nodes: NodeChanged
    nnodes: int = 1


@dataclass(frozen=True)
class RankStarted:
    rank: int
    local_rank: int
    pid: int
    at: float


@dataclass(frozen=True)
class RankStateChanged:
    rank: int
    state: RankState
    collective: str | None = None  # quiet in a collective gap: "behind" or "waiting" (hang.py)


@dataclass(frozen=True)
class RankOutput:
    """One read chunk of a rank's stream: its complete lines, sanitised when first asked for.

    ``raw`` is the lines as the rank wrote them, joined by newlines (no final one). A view that
    shows every line (``--no-tui``) reads ``lines``; one that shows a few of a flood (the TUI)
    reads ``tail(n)`` and never pays for the rest.

    Bounded: from the engine ``raw`` is at most one read chunk plus the held-back partial line
    (``engine.output.MAX_OUTPUT_BYTES``, 128 KiB), however long the rank's lines are; each of
    ``lines`` is at most ``MAX_LINE_CHARS`` characters. A view keeping chunks bounds them itself.
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

    def tail(self, n: int, *, keep: bool = True) -> tuple[str, ...]:
        """The last ``n`` lines, sanitised; only those are decoded. All of them, once decoded,
        are kept as ``lines`` unless ``keep`` is false: a view that keeps chunks keeps their
        raw bytes only, not a decoded copy as well."""
        if n <= 0:
            return ()
        if "lines" in self.__dict__ or (n >= self.count and keep):
            return self.lines[-n:]
        if n >= self.count:
            return tuple(sanitize_block(self.raw))
        return tuple(sanitize_line(part.decode("utf-8", "replace"))
                     for part in self.raw.rsplit(b"\n", n)[1:])

    @cached_property
    def last_line(self) -> str:
        return self.tail(1)[0]

    def raw_only(self) -> RankOutput:
        """The same chunk without the text decoded from it so far (made again when asked): what
        a view that keeps chunks keeps. The line count, cheap to keep, comes along."""
        bare = RankOutput(self.rank, self.stream, self.raw)
        if "count" in self.__dict__:
            bare.__dict__["count"] = self.__dict__["count"]
        return bare


@dataclass(frozen=True)
class RankSampled:
    rank: int
    gauges: Gauges  # what the sampler measured, by the rank table's column key (sampler.py)
    output_age: float  # seconds since the rank last printed anything
    caught_mask: int = 0  # signals its main process handles (bit N-1: signal N), /proc SigCgt
    ignored_mask: int = 0  # ...and ignores (SigIgn): forwarding one of neither ends the rank


@dataclass(frozen=True)
class RankSignalled:
    rank: int
    signal: int
    purpose: Purpose
    reason: str
    at: float


@dataclass(frozen=True)
class RankExited:
    rank: int
    exit_code: int | None
    signal: int | None
    signalled_first: bool  # the supervisor had sent it a stop or kill signal
    at: float


@dataclass(frozen=True)
class RunStopping:
    kind: StopKind
    reason: str
    origin: str
    grace: float
    live_ranks: tuple[int, ...]
    at: float

    @property
    def deadline_at(self) -> float:
        return self.at + self.grace


@dataclass(frozen=True)
class RunEscalated:
    """A second cancel or a kill-now: every live rank gets SIGKILL at once (on every node)."""

    reason: str
    at: float


@dataclass(frozen=True)
class GraceExtended:
    """The stop under way got a longer grace (a preemption's window, known once slurmctld
    named the cause): the SIGKILL moves later."""

    grace: float  # seconds from the stop's start
    why: str
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
class RankStacks:
    """Where one rank was stuck: its main thread's innermost frame (``file:line function``),
    the file with every thread's stack, how they were read, or why there is none."""

    rank: int
    stuck_at: str | None
    file: str | None
    via: str | None  # "faulthandler" (the rank's own handler) or "py-spy"; None: no stacks
    note: str | None = None


@dataclass(frozen=True)
class StacksCaptured:
    """Every live rank's stacks were captured (before a stall stop, or on request)."""

    reason: str
    ranks: tuple[RankStacks, ...]
    at: float  # when the capture began
    seconds: float  # how long it took (at most the deadline)


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
    source: ProgressSource


@dataclass(frozen=True)
class RankEvidenceChanged:
    """The kind of progress that counts for a rank changed (announced once a sample pass)."""

    rank: int
    evidence: ProgressEvidence | None


@dataclass(frozen=True)
class RankReportedStop:
    """A rank said it received a stop signal, or that it stopped at an agreed step."""

    rank: int
    signal: str | None
    foreign: bool  # forgelm-tui had not signalled it: the signal came from elsewhere
    step: int | None


@dataclass(frozen=True)
class LogNotKept:
    """A rank log failed to write (full or unwritable run dir); views still get the output."""

    rank: int
    stream: Stream
    path: str
    error: str
    at: float


@dataclass(frozen=True)
class RunFinished:
    """Every rank has ended and its output is drained."""

    at: float


@dataclass(frozen=True)
class AttemptStarted:
    """With --max-restarts: attempt ``attempt`` (0: the first launch) of at most
    ``max_restarts + 1``, on ``nnodes`` nodes, begins ``backoff`` s after ``at``; ``reason``:
    why the last one is restarted. Its ranks' events follow as a new run's (``RunStarted``)."""

    attempt: int
    max_restarts: int
    reason: str
    backoff: float
    at: float
    nnodes: int = 1


@dataclass(frozen=True)
class RunNotice:
    text: str  # a line no other event says (a node waits for node 0's name to resolve)
    at: float


@dataclass(frozen=True)
class VerdictReached:
    """The true exit code is decided and the final envelope written."""

    verdict: Verdict
    envelope_path: str | None


@dataclass(frozen=True)
class RankSnapshot:
    rank: int
    local_rank: int
    node_rank: int
    pid: int | None
    state: RankState
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    signals: tuple[SignalSent, ...]
    last_line: str
    last_output_at: float | None
    step: int | None
    total: int | None
    metrics: dict[str, float]
    progress_source: ProgressSource | None
    gauges: Gauges
    caught_mask: int = 0
    ignored_mask: int = 0
    progress_evidence: ProgressEvidence | None = None
    gpu: RankGpu | None = None  # its last GPU sample; None without GPU sampling
    metrics_history: tuple[MetricSeries, ...] = ()  # the curve's metric, down-sampled


@dataclass(frozen=True)
class RunSnapshot:
    """The whole run at one moment: a late viewer starts here, then applies the events after."""

    run_id: str
    world_size: int
    argv: tuple[str, ...]
    run_dir: str
    started_at: float | None
    ranks: tuple[RankSnapshot, ...]
    stop: RunStopping | None = None
    finished_at: float | None = None
    verdict: VerdictReached | None = None
    node_rank: int = 0  # multi-node: this node; other nodes' ranks follow as NodeChanged
    nnodes: int = 1
    attempt: AttemptStarted | None = None  # with --max-restarts: the attempt under way
    gpus: tuple[GpuDevice, ...] = ()  # this node's devices at the last GPU sample
    grace: float | None = None  # the grace a stop would give now (the stop's own, once begun)


class NodeState(StrEnum):
    """A node of a multi-node run, as every node sees it (SPEC §8)."""

    JOINING = "joining"
    RUNNING = "running"
    DONE = "done"  # its ranks are over and it published their records
    LOST = "lost"  # its supervisor went silent past the node timeout


@dataclass(frozen=True)
class NodeChanged:
    """A node's state, and another node's ranks as it last reported them (at least once a
    second while they change): how remote ranks reach every view on every node."""

    node_rank: int
    host: str
    state: NodeState
    ranks: tuple[RankSnapshot, ...]
    at: float
    # Its row (a grouped view); ``complete``: every rank in ``ranks``, else those to read
    summary: NodeSummary | None = None
    complete: bool = True


Event = (
    RunStarted
    | RankStarted
    | RankStateChanged
    | RankOutput
    | RankSampled
    | GpuSampled
    | RankSignalled
    | RankExited
    | RunStopping
    | RunEscalated
    | GraceExtended
    | StopCountdown
    | RunStalled
    | StacksCaptured
    | SignalForwarded
    | RankProgressed
    | RankEvidenceChanged
    | RankReportedStop
    | LogNotKept
    | RunFinished
    | AttemptStarted
    | VerdictReached
    | NodeChanged
    | RunNotice
)
EVENT_TYPES: tuple[type, ...] = Event.__args__
