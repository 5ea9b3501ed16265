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


def spawn_rank(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | None,
    pipe_size: int = PIPE_DEFAULT,
) -> subprocess.Popen[bytes]:
    """Start one rank in its own session with non-blocking stdout/stderr pipes."""
    with children_unblocked():  # the rank gets no signal blocked (engine/signal_inbox.py)
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    for pipe in (proc.stdout, proc.stderr):
        assert pipe is not None
        os.set_blocking(pipe.fileno(), False)
        if pipe_size > PIPE_DEFAULT and _F_SETPIPE_SZ is not None:
            with contextlib.suppress(OSError):  # EPERM at the user's limit: keep the default
                fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, pipe_size)
    return proc


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
