"""What the TUI shows, folded from engine events. No Textual here: it is plain, testable state.

The engine calls :meth:`RunModel.apply` for every event on the event loop; widgets read the model
on their own timers (table at 2 Hz, logs at 10 Hz), so a flood of events never means a flood of
repaints.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from forgelm_tui.engine import events as ev
from forgelm_tui.verdict import describe

LOG_KEEP_MERGED = 20_000  # lines of the merged view kept in memory
LOG_KEEP_PER_RANK = 5_000  # lines of each rank kept for its own view
FLUSH_MAX_LINES = 1_000  # at most this many new lines reach a log widget per flush (10 Hz)


@dataclass
class RankRow:
    rank: int
    local_rank: int = 0
    pid: int | None = None
    state: str = "starting"
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    children: int = 0
    started_mono: float | None = None
    ended_mono: float | None = None
    last_output_mono: float | None = None
    last_line: str = ""
    exit_code: int | None = None
    signal: int | None = None
    sent: list[tuple[int, str]] = field(default_factory=list)  # (signal, reason)
    quiet: bool = False
    step: int | None = None
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def progress_text(self) -> str:
        """``12/30 loss 0.3100``: step, total and the first metric."""
        if self.step is None and not self.metrics:
            return ""
        parts = []
        if self.step is not None:
            parts.append(f"{self.step}/{self.total}" if self.total else str(self.step))
        for name, value in list(self.metrics.items())[:1]:
            parts.append(f"{name} {value:.4g}")
        return " ".join(parts)

    def exit_text(self) -> str:
        if self.exit_code is None:
            return ""
        return f"{self.exit_code} {describe(self.exit_code)[0].removeprefix('EXIT_')}"

    def signal_text(self) -> str:
        """``SIGTERM, sent: operator cancel``: the last signal and who sent it."""
        stop_sent = [(s, r) for s, r in self.sent if not r.startswith(("forward", "cleanup"))]
        if self.signal is not None:
            name = signal.Signals(self.signal).name
            if stop_sent:
                return f"{name}, sent: {_short_reason(stop_sent[-1][1])}"
            return f"{name}, not sent by forgelm-tui"
        if stop_sent:
            sig, reason = stop_sent[-1]
            return f"{signal.Signals(sig).name}, sent: {_short_reason(reason)}"
        return ""


def _short_reason(reason: str) -> str:
    """``stop: cancelled by operator`` -> ``operator cancel``, kept short for a table cell."""
    _, _, text = reason.partition(": ")
    text = text or reason
    if text.startswith("cancelled by "):
        return text.removeprefix("cancelled by ") + " cancel"
    return text


class LogLine(NamedTuple):  # a tuple: cheap to make by the hundred thousand
    rank: int
    stream: str
    text: str

    def render(self) -> str:
        marker = "!" if self.stream == "stderr" else " "
        return f"[rank {self.rank}]{marker}{self.text}"


class ChunkQueue:
    """Output events kept as they arrived, bounded by a line count.

    Adding costs O(1) per chunk whatever its size, and no line is decoded until it is read
    back: a flood of output never means per-line work in the view.
    """

    def __init__(self, max_lines: int) -> None:
        self.max_lines = max_lines
        self.chunks: deque[ev.RankOutput] = deque()
        self.lines = 0
        self.dropped = 0  # lines pushed out since the last clear

    def add(self, chunk: ev.RankOutput) -> None:
        self.chunks.append(chunk)
        self.lines += chunk.count
        while self.lines - self.chunks[0].count >= self.max_lines:
            gone = self.chunks.popleft().count
            self.lines -= gone
            self.dropped += gone

    def tail(self) -> list[LogLine]:
        """The last ``max_lines`` lines, oldest first."""
        out: list[LogLine] = []
        for chunk in reversed(self.chunks):
            need = self.max_lines - len(out)
            if need <= 0:
                break
            rank, stream = chunk.rank, chunk.stream
            out.extend(LogLine(rank, stream, text) for text in reversed(chunk.tail(need)))
        out.reverse()
        return out

    def clear(self) -> None:
        self.chunks.clear()
        self.lines = 0
        self.dropped = 0


class LogStore:
    """Bounded log memory with separate pending queues for the merged and per-rank views."""

    def __init__(self) -> None:
        self.merged = ChunkQueue(LOG_KEEP_MERGED)
        self.per_rank: dict[int, ChunkQueue] = {}
        self._pending = ChunkQueue(FLUSH_MAX_LINES)
        self.total = 0

    def add(self, chunk: ev.RankOutput) -> None:
        self.total += chunk.count
        self.merged.add(chunk)
        self.per_rank.setdefault(chunk.rank, ChunkQueue(LOG_KEEP_PER_RANK)).add(chunk)
        self._pending.add(chunk)

    def take_pending(self) -> tuple[list[LogLine], int]:
        """New lines since the last call (at most FLUSH_MAX_LINES), and how many were skipped."""
        lines = self._pending.tail()
        skipped = self._pending.dropped + self._pending.lines - len(lines)
        self._pending.clear()
        return lines, skipped

    def history(self, rank: int | None) -> list[LogLine]:
        if rank is None:
            return self.merged.tail()
        queue = self.per_rank.get(rank)
        return queue.tail() if queue else []


class RunModel:
    """The run as the TUI shows it."""

    def __init__(
        self,
        run_id: str,
        command: Sequence[str],
        world_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_id = run_id
        self.command = list(command)
        self.world_size = world_size
        self.clock = clock
        self.started_mono = clock()
        self.ended_mono: float | None = None
        self.state = "starting"
        self.stop_reason = ""
        self.stop_deadline: float | None = None  # on self.clock
        self.live_ranks: tuple[int, ...] = ()
        # Before a rank starts its local rank is already known (one node): no misleading 0s.
        self.ranks: dict[int, RankRow] = {r: RankRow(r, local_rank=r) for r in range(world_size)}
        self.logs = LogStore()
        self.notices: deque[str] = deque(maxlen=50)
        self.changed = True

    def apply(self, event: ev.Event) -> None:
        self.changed = True
        now = self.clock()
        match event:
            case ev.RankOutput(rank=rank) as output:
                row = self.ranks.setdefault(rank, RankRow(rank))
                row.last_output_mono = now
                row.last_line = output.last_line
                row.quiet = False
                self.logs.add(output)
            case ev.RunStarted():
                self.state = "running"
            case ev.RankStarted(rank=rank, local_rank=local_rank, pid=pid):
                row = self.ranks.setdefault(rank, RankRow(rank))
                row.local_rank, row.pid, row.state, row.started_mono = (
                    local_rank, pid, "running", now)
            case ev.RankSampled(rank=rank) as sample:
                self._sampled(sample)
            case ev.RankSignalled(rank=rank, signal=sig, reason=reason):
                row = self.ranks.setdefault(rank, RankRow(rank))
                row.sent.append((sig, reason))
                if row.ended_mono is None and not reason.startswith("forward"):
                    row.state = "stopping"
            case ev.RankExited(rank=rank, exit_code=code, signal=sig, signalled_first=first):
                row = self.ranks.setdefault(rank, RankRow(rank))
                row.exit_code, row.signal, row.ended_mono = code, sig, now
                if sig is not None:
                    row.state = "killed"
                elif code not in (0, 3, 4, 5, 6) and not first:
                    row.state = "failed"
                else:
                    row.state = "exited"
            case ev.RunStopping(reason=reason, grace=grace, live_ranks=live):
                self.state = "stopping"
                self.stop_reason = reason
                self.stop_deadline = now + grace
                self.live_ranks = live
            case ev.StopCountdown(seconds_left=left, live_ranks=live):
                self.stop_deadline = now + left
                self.live_ranks = live
            case ev.RunStalled(seconds=seconds, ranks=ranks):
                self.notices.append(f"stalled: no progress from rank(s) {ranks} for {seconds:g} s")
            case ev.SignalForwarded(signal=sig, ranks=ranks):
                name = signal.Signals(sig).name
                self.notices.append(f"{name} forwarded to {len(ranks)} rank(s)")
            case ev.RankProgressed(rank=rank, step=step, total=total, metrics=metrics):
                row = self.ranks.setdefault(rank, RankRow(rank))
                row.step, row.total, row.metrics = step, total, dict(metrics)
            case ev.RankReportedStop(rank=rank, signal=sig, outside=outside):
                if outside and sig:
                    self.notices.append(f"rank {rank} received {sig} from outside forgelm-tui")
            case ev.RunFinished():
                self.state = "finished"
                self.ended_mono = now
            case _:
                pass

    def _sampled(self, sample: ev.RankSampled) -> None:
        row = self.ranks.setdefault(sample.rank, RankRow(sample.rank))
        row.cpu_percent = sample.cpu_percent
        row.rss_bytes = sample.rss_bytes
        row.children = sample.children
        row.quiet = sample.quiet
        if row.state in ("running", "quiet"):
            row.state = "quiet" if sample.quiet else "running"

    def elapsed(self) -> float:
        end = self.ended_mono if self.ended_mono is not None else self.clock()
        return max(0.0, end - self.started_mono)

    def seconds_left(self) -> float | None:
        if self.stop_deadline is None or self.state != "stopping":
            return None
        return max(0.0, self.stop_deadline - self.clock())

    def uptime(self, row: RankRow) -> float | None:
        if row.started_mono is None:
            return None
        end = row.ended_mono if row.ended_mono is not None else self.clock()
        return max(0.0, end - row.started_mono)

    def output_age(self, row: RankRow) -> float | None:
        if row.ended_mono is not None:
            return None
        since = row.last_output_mono or row.started_mono
        return None if since is None else max(0.0, self.clock() - since)
