"""Output for viewers that show a tail (the attach TUI asks for it in its hello): each rank's
output coalesced, at most TAIL_LINES lines and TAIL_BYTES bytes per rank and stream per tick,
and how many lines were left out. The rank log files keep every line; a viewer reads them for
its history.

Chunks are only kept (never copied or decoded) until the tick, and the oldest go as soon as
the newer ones hold a whole tail: a flood costs the server a count of newlines per chunk, not
an encoding and a socket write of every byte for every viewer.
"""

from __future__ import annotations

from collections import deque

from forgelm_tui.engine import events as ev

TAIL_LINES = 100  # per rank and stream, per tick
TAIL_BYTES = 32 << 10  # the same, in bytes (a long line is cut to this)
TICK = 0.1  # s: output reaches tail viewers at most about 10 times a second


class StreamTail:
    """One rank's stream since the last tick: the newest chunks, and the lines already gone."""

    def __init__(self) -> None:
        self.chunks: deque[tuple[bytes, int]] = deque()  # (raw, its line count)
        self.lines = 0
        self.bytes = 0
        self.skipped = 0

    def add(self, raw: bytes, count: int) -> None:
        self.chunks.append((raw, count))
        self.lines += count
        self.bytes += len(raw)
        while len(self.chunks) > 1:
            oldest, gone = self.chunks[0]
            if self.lines - gone < TAIL_LINES and self.bytes - len(oldest) < TAIL_BYTES:
                break
            self.chunks.popleft()
            self.lines -= gone
            self.bytes -= len(oldest)
            self.skipped += gone

    def take(self) -> tuple[bytes, int]:
        """The tail (its last TAIL_LINES lines, at most TAIL_BYTES) and the lines left out."""
        raw = b"\n".join(chunk for chunk, _ in self.chunks)
        skipped = self.skipped + max(0, self.lines - TAIL_LINES)
        body = raw
        if self.lines > TAIL_LINES:  # the remainder, then the last TAIL_LINES lines
            body = b"\n".join(raw.rsplit(b"\n", TAIL_LINES)[1:])
        if len(body) > TAIL_BYTES:  # whole lines from the first that starts within the budget
            cut = body.find(b"\n", len(body) - TAIL_BYTES - 1)
            if cut < 0:
                cut = body.rfind(b"\n")
            if cut >= 0:
                skipped += body.count(b"\n", 0, cut + 1)
                body = body[cut + 1:]
        return body[-TAIL_BYTES:], skipped


class OutputTails:
    """Every rank's pending tail; :meth:`take` empties them, in rank order."""

    def __init__(self) -> None:
        self._streams: dict[tuple[int, ev.Stream], StreamTail] = {}

    def __bool__(self) -> bool:
        return bool(self._streams)

    def add(self, chunk: ev.RankOutput) -> None:
        key = (chunk.rank, chunk.stream)
        tail = self._streams.get(key)
        if tail is None:
            tail = self._streams[key] = StreamTail()
        tail.add(chunk.raw, chunk.count)

    def take(self) -> tuple[list[ev.RankOutput], dict[int, int]]:
        """The tails as output events, and the lines left out per rank (only ranks with some)."""
        events: list[ev.RankOutput] = []
        skipped: dict[int, int] = {}
        for (rank, stream), tail in sorted(self._streams.items(),
                                           key=lambda item: (item[0][0], item[0][1].value)):
            raw, left_out = tail.take()
            events.append(ev.RankOutput(rank, stream, raw))
            if left_out:
                skipped[rank] = skipped.get(rank, 0) + left_out
        self._streams.clear()
        return events, skipped
