"""One rank log file that a full or broken disk cannot turn into a supervisor crash.

A failed write (ENOSPC, EACCES, EROFS, EIO, ...) never raises: the bytes that could not be
written are counted, the rank's pipe keeps draining, and the views still get the output. After
a failure the file is tried again at most every RETRY_EVERY seconds (space may come back: a
cleaner ran, a quota grew); the bytes in between are counted as lost, not buffered (a flooding
rank could fill the supervisor's memory), so the log then has a gap the envelope records.
The files are opened 0600 by the output drain (``private_files.open_private``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from forgelm_tui.private_files import error_text

RETRY_EVERY = 5.0  # seconds between attempts once a write failed


@dataclass
class LogLoss:
    """What one rank log did not keep (envelope ``storage``, docs/envelope.md)."""

    rank: int
    stream: str  # stdout | stderr
    path: str
    error: str  # "ENOSPC: No space left on device", the first failure's
    since: float  # wall clock of the first failed write
    bytes_lost: int = 0
    failures: int = 0  # failed write attempts (the first and each retry that failed)
    resumed_at: float | None = None  # the last time writing worked again after a failure


class LogFile:
    """Writes a rank stream's bytes to its log; a failure is counted, never raised."""

    def __init__(self, fd: int, rank: int, stream: str, path: str, *,
                 on_loss: Callable[[LogLoss], None] = lambda loss: None,
                 write: Callable[[int, memoryview], int] = os.write,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.fd = fd
        self.rank, self.stream, self.path = rank, stream, path
        self.loss: LogLoss | None = None
        self._on_loss = on_loss
        self._write = write
        self._clock = clock
        self._wall = wall
        self._retry_at: float | None = None  # set while failing

    @property
    def failing(self) -> bool:
        return self._retry_at is not None

    def write(self, data: bytes) -> int:
        """Write every byte it can; returns how many were written."""
        if self._retry_at is not None and self._clock() < self._retry_at:
            self._lost(len(data))
            return 0
        view = memoryview(data)
        written = 0
        while view:
            try:
                count = self._write(self.fd, view)
            except InterruptedError:
                continue
            except OSError as exc:
                self._failed(exc, len(view))
                return written
            if count <= 0:  # no progress and no error: never spin on it
                self._failed(OSError(errno.EIO, "the write made no progress"), len(view))
                return written
            written += count
            view = view[count:]
        if self._retry_at is not None and self.loss is not None:
            self._retry_at = None  # it works again
            self.loss.resumed_at = self._wall()
        return written

    def _failed(self, exc: OSError, unwritten: int) -> None:
        self._retry_at = self._clock() + RETRY_EVERY
        first = self.loss is None
        if self.loss is None:
            self.loss = LogLoss(self.rank, self.stream, self.path, error_text(exc), self._wall())
        self.loss.failures += 1
        self._lost(unwritten)
        if first:
            self._on_loss(self.loss)

    def _lost(self, count: int) -> None:
        assert self.loss is not None
        self.loss.bytes_lost += count

    def close(self) -> None:
        with contextlib.suppress(OSError):  # EIO at close: the bytes were counted as written
            os.close(self.fd)
