"""Rank output: pipes -> per-rank log files -> one event per read chunk.

Every byte goes to the rank's log file as it arrives, whatever any view does; views get
:class:`RankOutput` events of complete lines. Nothing here is per line.

Memory per rank stream is bounded whatever the rank writes: one read chunk (READ_CHUNK), the
partial line held back (at most MAX_PENDING_BYTES; a longer line is shown by its head and
skipped to its newline) and one event in flight (at most MAX_OUTPUT_BYTES), plus the stderr
tail (STDERR_TAIL_LINES sanitised lines, each at most MAX_LINE_CHARS characters).

A log that cannot be written (a full or unwritable run dir) never stops the draining: the
:class:`LogFile` counts what it could not keep and tells views once (``LogNotKept``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import Stream
from forgelm_tui.engine.logfile import LogFile, LogLoss
from forgelm_tui.engine.progress import ProgressReader
from forgelm_tui.engine.records import STDERR_TAIL_LINES, Evidence, RankRecord
from forgelm_tui.engine.sanitize import MAX_PENDING_BYTES, LineSplitter
from forgelm_tui.engine.spawn import OutputPipes
from forgelm_tui.private_files import open_private

READ_CHUNK = 1 << 16
MAX_OUTPUT_BYTES = READ_CHUNK + MAX_PENDING_BYTES + 1  # the most raw one RankOutput carries
LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW


class OutputDrain:
    def __init__(self, loop: asyncio.AbstractEventLoop, emit: Callable[[ev.Event], None],
                 progress: ProgressReader, on_closed: Callable[[], None]) -> None:
        self._loop = loop
        self._emit = emit
        self._progress = progress
        self._on_closed = on_closed
        self._log_fds: dict[int, LogFile] = {}  # pipe fd -> its log
        self._streams: dict[int, tuple[RankRecord, Stream, LineSplitter]] = {}  # pipe fd ->
        self._pipes: dict[int, OutputPipes] = {}  # rank -> its pipes (fds closed once, by us)

    @property
    def open(self) -> bool:
        return bool(self._log_fds)

    @contextlib.contextmanager
    def logs_for(self, record: RankRecord) -> Iterator[tuple[int, int]]:
        """The rank's two log files, opened before it starts; closed again if it cannot."""
        out_fd = open_private(record.stdout_log, LOG_FLAGS)
        try:
            err_fd = open_private(record.stderr_log, LOG_FLAGS)
        except OSError:
            os.close(out_fd)
            raise
        try:
            yield out_fd, err_fd
        except BaseException:
            os.close(out_fd)
            os.close(err_fd)
            raise

    def attach(self, record: RankRecord, pipes: OutputPipes, logs: tuple[int, int]) -> None:
        self._pipes[record.rank] = pipes
        for fd, stream, log_fd, path in (
                (pipes.stdout, Stream.STDOUT, logs[0], record.stdout_log),
                (pipes.stderr, Stream.STDERR, logs[1], record.stderr_log)):
            self._log_fds[fd] = LogFile(log_fd, record.rank, stream.value, path,
                                        on_loss=functools.partial(self._not_kept, record))
            splitter = LineSplitter()
            self._streams[fd] = (record, stream, splitter)
            self._loop.add_reader(fd, self._readable, record, stream, fd, splitter)

    def read_rest(self, record: RankRecord) -> None:
        """The rank was reaped: let its pipes end (OutputPipes) and read what it left in them
        now, as much as a pipe holds (what a descendant writes on is read as usual)."""
        pipes = self._pipes.get(record.rank)
        if pipes is None:
            return
        pipes.release_writers()
        for fd, (owner, stream, splitter) in list(self._streams.items()):
            if owner is record:
                for _ in range(pipes.size // READ_CHUNK + 2):
                    if not self._readable(record, stream, fd, splitter):
                        break

    def _readable(self, record: RankRecord, stream: Stream, fd: int,
                  splitter: LineSplitter) -> bool:
        """One read; whether it found data (False: nothing now, or the end)."""
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._close(fd)
            self._deliver(record, stream, splitter.flush())
            self._on_closed()
            return False
        self._log_fds[fd].write(data)
        if stream is Stream.STDOUT:
            record.stdout_bytes += len(data)
        else:
            record.stderr_bytes += len(data)
        record.last_output_at = time.time()
        record.last_output_mono = now = time.monotonic()
        record.saw(Evidence.OUTPUT, now)
        self._deliver(record, stream, splitter.split(data))
        tail = data[data.rfind(b"\n") + 1 :]
        if b"\r" in tail:  # a bar redrawn in place: its latest state, raw (a nested bar's
            self._progress.read_output(record, tail)  # cursor-up tells it apart)
        return True

    def _deliver(self, record: RankRecord, stream: Stream, block: bytes | None) -> None:
        if block is None:
            return
        output = ev.RankOutput(record.rank, stream, block)
        record.last_line = output.last_line
        if stream is Stream.STDERR:
            record.stderr_tail.extend(output.tail(STDERR_TAIL_LINES))
        self._emit(output)
        self._progress.read_output(record, block)

    def _not_kept(self, record: RankRecord, loss: LogLoss) -> None:
        record.log_losses.append(loss)
        self._emit(ev.LogNotKept(record.rank, Stream(loss.stream), loss.path, loss.error,
                                 loss.since))

    def _close(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        entry = self._streams.pop(fd, None)
        if entry is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
            pipes = self._pipes[entry[0].rank]
            if not any(other in self._streams for other in (pipes.stdout, pipes.stderr)):
                pipes.release_writers()  # both read ends closed: nothing left of its pipes
        log = self._log_fds.pop(fd, None)
        if log is not None:
            log.close()

    def close_all(self) -> None:
        for fd in list(self._streams):
            self._close(fd)
        for pipes in self._pipes.values():
            pipes.release_writers()
