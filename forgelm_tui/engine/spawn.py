"""Starting rank processes: one session per rank, pipes for the drain.

No ``preexec_fn`` (a parent-death signal was set there once): Python code between fork and exec
rules out ``vfork`` (8 ranks took 70-90 ms to start instead of 30-40) and is unsafe while threads
run (the TUI's, the headless writer's). A SIGKILLed supervisor is covered without it: the guardian
(guardian.py) signals every rank group it was told of and every process carrying the
supervisor's token, which each rank has from the start, also one spawned a moment before the
supervisor died, before the guardian heard of its group.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from forgelm_tui.engine.signal_inbox import children_unblocked

_PR_SET_CHILD_SUBREAPER = 36

# Room in each output pipe. With the kernel's default 64 KiB a rank printing fast blocks within
# a few ms whenever the supervisor is busy elsewhere (a TUI frame takes 10-30 ms); a bigger pipe
# lets it run on. All ranks together stay within a quarter of Linux's default per-user soft
# limit (pipe-user-pages-soft, 64 MiB): past it, every new pipe of the user gets one page.
PIPE_BUDGET = 16 << 20
PIPE_MAX = 1 << 20
PIPE_DEFAULT = 64 << 10
_F_SETPIPE_SZ: int | None = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only


def pipe_capacity(local_ranks: int) -> int:
    """The size to ask for each of a rank's two output pipes."""
    return max(PIPE_DEFAULT, min(PIPE_MAX, PIPE_BUDGET // (2 * max(1, local_ranks))))


def _load_prctl() -> Callable[..., int] | None:
    # The running interpreter already links libc: no find_library (it runs ldconfig).
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def set_child_subreaper() -> bool:
    """Orphans among this process's descendants (a rank's double-forked daemon) reparent to it
    instead of init, so they stay its children (engine/descendants.py). False if refused."""
    return _PRCTL is not None and _PRCTL(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


@dataclass
class OutputPipes:
    """A rank's stdout and stderr: the read ends (non-blocking), and the supervisor's own copy of
    each write end, held until the rank is reaped. The rank's exit then closes no pipe: the loop
    wakes once, for its pidfd, not first for two EOFs that would take the exiting rank's CPU
    (the peers' SIGTERM waited on both); once the writers are released, the EOF comes as soon as
    nothing else (a rank's descendant) holds them."""

    stdout: int
    stderr: int
    writers: list[int]
    size: int = PIPE_DEFAULT  # the room asked for in each: the most an ended rank left there

    def release_writers(self) -> None:
        while self.writers:
            os.close(self.writers.pop())

    def close(self) -> None:
        self.release_writers()
        for fd in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                os.close(fd)


def spawn_rank(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | None,
    pipe_size: int = PIPE_DEFAULT,
) -> tuple[subprocess.Popen[bytes], OutputPipes]:
    """Start one rank in its own session with its output in pipes (OutputPipes)."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)  # the rank's fds 1 and 2 are dup2'd: no CLOEXEC
    pipes = OutputPipes(out_r, err_r, [out_w, err_w], max(pipe_size, PIPE_DEFAULT))
    try:
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)  # the read ends only: the rank writes as ever
            if pipe_size > PIPE_DEFAULT and _F_SETPIPE_SZ is not None:
                with contextlib.suppress(OSError):  # EPERM at the user's limit: the default
                    fcntl.fcntl(fd, _F_SETPIPE_SZ, pipe_size)
        with children_unblocked():  # the rank gets no signal blocked (signal_inbox.py)
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                close_fds=True,
            )
    except BaseException:
        pipes.close()
        raise
    return proc, pipes


def signal_group(pgid: int, sig: int) -> bool:
    """Signal a rank's whole process group; False when nothing of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def signal_process(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_alive(pgid: int) -> bool:
    with contextlib.suppress(PermissionError):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
    return True
