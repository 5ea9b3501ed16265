"""The guardian: a forked watcher that stops the rank groups if the supervisor dies.

A parent-death signal would reach only the rank process itself, not its children (DataLoader
workers, a wrapper script's python), and ranks have none (spawn.py). The guardian outlives a
SIGKILLed supervisor: it holds the read end of a pipe whose only writer is the supervisor,
learns each rank's process group through it, and when the pipe reaches end-of-file without a
clean goodbye it sends SIGTERM to every group and to every process carrying the supervisor's
token in its environment (what the ranks started outside their groups: daemons, ``setsid``;
engine/descendants.py), waits a short grace and SIGKILLs what is left.

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
TOKEN_ENV = "FORGELM_TUI_SUPERVISOR"  # every rank's environment: the supervisor's token
_POLL = 0.02


def new_token() -> str:
    return os.urandom(8).hex()


def token_needle(token: str) -> bytes:
    """What ``b"\\0" + environ`` contains when a process carries the token."""
    return f"\0{TOKEN_ENV}={token}\0".encode()


class Guardian:
    """The supervisor's end of the guardian pipe."""

    def __init__(self, grace: float = GUARDIAN_GRACE) -> None:
        # The supervisor's token (docs/architecture.md, process model), given to the child at
        # the fork.
        self.token = new_token()
        needle = token_needle(self.token)
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child
            try:
                os.close(write_fd)
                _watch(read_fd, grace, needle)
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


def _watch(fd: int, grace: float, needle: bytes) -> None:  # pragma: no cover - forked child
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())  # none held for the supervisor's inbox
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
    _stop_all(groups, needle, grace)


def _close_other_fds(keep: int) -> None:  # pragma: no cover - runs in the forked child
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(devnull, std)
    os.closerange(3, keep)
    os.closerange(keep + 1, 65536)


def _stop_all(groups: set[int], needle: bytes, grace: float) -> None:  # pragma: no cover
    """SIGTERM to every rank group and every process with the token; SIGKILL after the grace
    (the token is scanned again each time: a daemon may fork as it goes)."""
    live = {g for g in groups if _send(g, signal.SIGTERM)}
    marked = _marked(needle)
    for pid in marked:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (live or marked) and time.monotonic() < deadline:
        time.sleep(_POLL)
        live = {g for g in live if _send(g, 0)}
        marked = _marked(needle)
    for group in live:
        _send(group, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while marked and time.monotonic() < deadline:
        for pid in marked:
            _kill(pid, signal.SIGKILL)
        time.sleep(_POLL)
        marked = _marked(needle)


def _marked(needle: bytes) -> list[int]:  # pragma: no cover - runs in the forked child
    """Live processes whose environment carries the token (a zombie's reads empty)."""
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:  # gone, or another user's
            continue
        if needle in b"\0" + environ:
            found.append(int(name))
    return found


def _kill(pid: int, sig: int) -> None:  # pragma: no cover - runs in the forked child
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _send(pgid: int, sig: int) -> bool:  # pragma: no cover - runs in the forked child
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
