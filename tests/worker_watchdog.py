"""Every process a test starts dies with the test's process, also when that process is SIGKILLed.

Each pytest process (the xdist controller and every worker, or a plain ``pytest``) puts a random
token in its environment, ``FORGELM_TUI_TEST_WORKER``, before it starts anything: every
supervisor, rank, daemon, tmux server and browser a test starts inherits it (an environment is
inherited at fork and kept through exec). A watchdog (this file run as a script, in a session of
its own, without the token) holds the read end of a pipe whose only writer is that pytest
process; at end-of-file (the process exited, or was killed) it SIGKILLs every process that still
carries the token, pass after pass until none is left (a dying process may have forked), for at
most :data:`SWEEP_FOR` seconds. A normal end of the session sweeps too: nothing outlives it.

A process that clears its environment escapes the token; the supervisor's own guardian and
subreaper cover those of its ranks (forgelm_tui/engine/descendants.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

TOKEN_ENV = "FORGELM_TUI_TEST_WORKER"
SWEEP_FOR = 10.0
_held: list[int] = []  # the pipe's write end, open for the life of the pytest process


def start_watchdog() -> str:
    """Mark this process's future children with a new token and start their watchdog (once per
    process); returns the token."""
    if _held:
        return os.environ[TOKEN_ENV]
    token = os.urandom(8).hex()
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    read_fd, write_fd = os.pipe()  # both non-inheritable: no child of the tests holds it open
    subprocess.Popen([sys.executable, os.path.abspath(__file__), token], stdin=read_fd,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                     start_new_session=True)
    os.close(read_fd)
    _held.append(write_fd)
    os.environ[TOKEN_ENV] = token
    return token


def carrying(token: str) -> list[int]:
    """Live processes whose environment holds the token (a zombie's environment reads empty)."""
    needle = f"\0{TOKEN_ENV}={token}\0".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = b"\0" + handle.read() + b"\0"
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ:
            found.append(int(name))
    return found


def sweep(token: str, within: float = SWEEP_FOR) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [pid for pid in carrying(token) if pid != os.getpid()]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _watch(token: str) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it sweeps once the pytest process is gone, no sooner
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    sweep(token)


if __name__ == "__main__":
    _watch(sys.argv[1])
