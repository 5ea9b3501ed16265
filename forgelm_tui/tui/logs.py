"""The rank output a TUI keeps: bounded by lines and by bytes, decoded only when shown."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from forgelm_tui.engine import events as ev

LOG_KEEP_MERGED = 20_000  # lines of the merged view kept in memory
LOG_KEEP_PER_RANK = 5_000  # lines of each rank kept for its own view
FLUSH_MAX_LINES = 1_000  # at most this many new lines reach a log widget per flush (10 Hz)
# Bytes as well as lines, since one line can be 128 KiB as written: the raw bytes of the chunks
# kept and CHUNK_BYTES each (no decoded text is kept: lines are decoded when shown).
LOG_KEEP_MERGED_BYTES = 8 << 20  # the merged view's history
LOG_KEEP_RANKS_BYTES = 16 << 20  # every rank's own history together, shared evenly
FLUSH_MAX_BYTES = 2 << 20  # new output waiting for the next flush
# A chunk whose lines average more than this is kept as the text it shows: each line at most
# MAX_LINE_CHARS (2000) characters, 4 UTF-8 bytes each at worst, so keeping it never grows it.
COMPACT_LINE_BYTES = 8 * 1024
CHUNK_BYTES = 256  # what a kept chunk costs besides its raw bytes (measured: about 220)



class LogLine(NamedTuple):  # a tuple: cheap to make by the hundred thousand
    rank: int
    stream: str
    text: str

    def render(self) -> str:
        marker = "!" if self.stream == "stderr" else " "
        return f"[rank {self.rank}]{marker}{self.text}"


class ChunkQueue:
    """Output events kept as they arrived, bounded by a line count and by bytes.

    ``bytes`` is the chunks' raw size plus CHUNK_BYTES each: about the memory they hold. The
    oldest go first; the newest always stays.

    Adding costs O(1) per chunk whatever its size, and no line is decoded until it is read
    back: a flood of output never means per-line work in the view.
    """

    def __init__(self, max_lines: int, max_bytes: int = LOG_KEEP_MERGED_BYTES) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.chunks: deque[ev.RankOutput] = deque()
        self.lines = 0
        self.bytes = 0
        self.dropped = 0  # lines pushed out since the last clear

    def add(self, chunk: ev.RankOutput) -> None:
        self.chunks.append(chunk)
        self.lines += chunk.count
        self.bytes += len(chunk.raw) + CHUNK_BYTES
        self._prune()

    def limit(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._prune()

    def _prune(self) -> None:
        chunks = self.chunks
        while len(chunks) > 1 and (self.lines - chunks[0].count >= self.max_lines
                                   or self.bytes > self.max_bytes):
            gone = chunks.popleft()
            self.lines -= gone.count
            self.bytes -= len(gone.raw) + CHUNK_BYTES
            self.dropped += gone.count

    def tail(self) -> list[LogLine]:
        """The last ``max_lines`` lines, oldest first."""
        out: list[LogLine] = []
        for chunk in reversed(self.chunks):
            need = self.max_lines - len(out)
            if need <= 0:
                break
            rank, stream = chunk.rank, chunk.stream
            texts = chunk.tail(need, keep=False)  # kept chunks hold raw bytes only
            out.extend(LogLine(rank, stream, text) for text in reversed(texts))
        out.reverse()
        return out

    def clear(self) -> None:
        self.chunks.clear()
        self.lines = 0
        self.bytes = 0
        self.dropped = 0


class LogStore:
    """Bounded log memory with separate pending queues for the merged and per-rank views.

    The queues share the chunks. Lines that average over COMPACT_LINE_BYTES are kept as the
    text they show, not as written: a 60 KB line costs about 2 KB here.
    """

    def __init__(self) -> None:
        self.merged = ChunkQueue(LOG_KEEP_MERGED, LOG_KEEP_MERGED_BYTES)
        self.per_rank: dict[int, ChunkQueue] = {}
        self._pending = ChunkQueue(FLUSH_MAX_LINES, FLUSH_MAX_BYTES)
        self.total = 0

    def add(self, chunk: ev.RankOutput) -> None:
        self.total += chunk.count
        if len(chunk.raw) > COMPACT_LINE_BYTES * chunk.count:
            chunk = ev.RankOutput.of(chunk.rank, chunk.stream, chunk.lines)
        else:  # the same bytes, without what the event decoded for others (its last line)
            chunk = chunk.raw_only()
        self.merged.add(chunk)
        queue = self.per_rank.get(chunk.rank)
        if queue is None:
            queue = ChunkQueue(LOG_KEEP_PER_RANK, LOG_KEEP_RANKS_BYTES)
            self.per_rank[chunk.rank] = queue
            share = LOG_KEEP_RANKS_BYTES // len(self.per_rank)
            for each in self.per_rank.values():
                each.limit(share)
        queue.add(chunk)
        self._pending.add(chunk)

    @property
    def held_bytes(self) -> int:
        """Bytes held as the queues count them, each chunk once (a Python loop: for tests)."""
        queues = (self.merged, self._pending, *self.per_rank.values())
        return sum({id(c): len(c.raw) + CHUNK_BYTES for q in queues for c in q.chunks}.values())

    def take_pending(self) -> tuple[list[LogLine], int]:
        """New lines since the last call (at most FLUSH_MAX_LINES, FLUSH_MAX_BYTES) and how many
        were skipped."""
        lines = self._pending.tail()
        skipped = self._pending.dropped + self._pending.lines - len(lines)
        self._pending.clear()
        return lines, skipped

    def history(self, rank: int | None) -> list[LogLine]:
        if rank is None:
            return self.merged.tail()
        queue = self.per_rank.get(rank)
        return queue.tail() if queue else []
