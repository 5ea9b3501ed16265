"""The guardian: a forked watcher that stops the rank groups if the supervisor dies.

A parent-death signal reaches only the rank process itself, not its children (DataLoader
workers, a wrapper script's python). The guardian outlives a SIGKILLed supervisor: it holds the
read end of a pipe whose only writer is the supervisor, learns each rank's process group through
it, and when the pipe reaches end-of-file without a clean goodbye it sends SIGTERM to every group,
waits a short grace and SIGKILLs what is left.

It is forked before any thread starts, runs in its own session (a terminal's Ctrl+C and a
``kill -- -PGID`` aimed at the supervisor's group do not reach it) and never imports anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

GUARDIAN_GRACE = 1.0
_GOODBYE = b"x"


class Guardian:
    """The supervisor's end of the guardian pipe."""

    def __init__(self, grace: float = GUARDIAN_GRACE) -> None:
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child
            try:
                os.close(write_fd)
                _watch(read_fd, grace)
            finally:
                os._exit(0)
        os.close(read_fd)
        self.pid = pid
        self._fd: int | None = write_fd

    def watch(self, pgid: int) -> None:
        self._send(b"+%d\n" % pgid)

    def forget(self, pgid: int) -> None:
        self._send(b"-%d\n" % pgid)

    def close(self) -> None:
        """Clean goodbye: the supervisor has dealt with every group itself."""
        if self._fd is None:
            return
        self._send(_GOODBYE + b"\n")
        os.close(self._fd)
        self._fd = None
        # No waitpid: the guardian leaves on its own at once, and the supervisor is about to
        # exit (the zombie goes to init). Waiting would only add to the exit latency.

    def abandon(self) -> None:
        """Close without a goodbye: the guardian stops every rank group it knows of."""
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def _send(self, message: bytes) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(BrokenPipeError):
            os.write(self._fd, message)


def _watch(fd: int, grace: float) -> None:  # pragma: no cover - runs in the forked child
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    _close_other_fds(fd)
    groups: set[int] = set()
    buffered = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            if line == _GOODBYE:
                return
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
    _stop_groups(groups, grace)


def _close_other_fds(keep: int) -> None:  # pragma: no cover - runs in the forked child
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(devnull, std)
    os.closerange(3, keep)
    os.closerange(keep + 1, 65536)


def _stop_groups(groups: set[int], grace: float) -> None:  # pragma: no cover - forked child
    live = {g for g in groups if _send(g, signal.SIGTERM)}
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.02)
        live = {g for g in live if _send(g, 0)}
    for group in live:
        _send(group, signal.SIGKILL)


def _send(pgid: int, sig: int) -> bool:  # pragma: no cover - runs in the forked child
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
