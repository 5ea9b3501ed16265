"""Where this rank is stuck: faulthandler on the signal the supervisor reserves for it.

When the supervisor names its stacks signal (``FORGELM_TUI_STACKS_SIGNAL``, see
``forgelm_tui.channel``), the rank runtime registers ``faulthandler`` on it: every thread's
Python stack is written to ``<run dir>/rank-N.stacks.txt`` by a C signal handler, which works
while the main thread is stuck in C code (a collective, a CUDA sync) and needs no GIL. Then it
announces the handler on the channel: the supervisor sends the signal to announced ranks only,
since a real-time signal's default action ends the process.

Installed once per process, by the graceful runner and by the channel client's first message,
so every rank that uses ``forgelm_tui.rank`` has it. Outside forgelm-tui (or under a supervisor
that does not ask for it) nothing is installed. A program that handles the signal itself keeps
its handler, and is then not announced. No torch here, and no import of the channel client
(it calls this module): the announcement goes through the ``send`` it is given.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from forgelm_tui.channel import STACKS_ENV, MessageKind, stacks_file_name

RUN_DIR_ENV = "FORGELM_TUI_RUN_DIR"

_tried = False
_file: BinaryIO | None = None  # kept open for the process's lifetime: faulthandler writes to it


def install(send: Callable[..., Any]) -> bool:
    """Register the handler and announce it (once per process); True when it is installed."""
    global _tried, _file
    if _tried:
        return _file is not None
    _tried = True  # before anything else: the announcement goes through ``send``, which calls us
    signum = reserved_signal()
    run_dir = os.environ.get(RUN_DIR_ENV)
    rank = os.environ.get("RANK", "")
    if signum is None or not run_dir or not rank.isdigit():
        return False
    before = signal.getsignal(signum)
    if before not in (signal.SIG_DFL, signal.SIG_IGN, None):
        return False  # the program handles this signal itself: never take it over
    path = os.path.join(run_dir, stacks_file_name(int(rank)))
    try:
        handle = open(path, "ab", buffering=0,  # noqa: SIM115 (open as long as the process)
                      opener=lambda name, flags: os.open(name, flags, 0o600))
    except OSError:
        return False
    # What faulthandler restores when the interpreter finalizes: ignored, so a capture that
    # reaches a rank in its last moments (handler gone, process not yet ended) is not its
    # death by a real-time signal's default action. Python sets a disposition from the main
    # thread only: installed from another (the collectives watcher's first message), the
    # main thread does it at exit instead (atexit runs there, before faulthandler's end).
    ignore = threading.current_thread() is threading.main_thread()
    if not ignore:
        atexit.register(ignore_at_exit, signum)
    try:
        if ignore:
            signal.signal(signum, signal.SIG_IGN)
        faulthandler.register(signum, file=handle, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        if ignore:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, before if before is not None else signal.SIG_DFL)
        handle.close()
        return False
    _file = handle
    send(MessageKind.STACKS_HANDLER, signum=signum, pid=os.getpid(),
         thread=threading.main_thread().ident, file=path)
    return True


def ignore_at_exit(signum: int) -> None:
    """At the interpreter's exit, for a handler installed from another thread: no more dumps
    from here, and the signal ignored rather than left to its default action."""
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        faulthandler.unregister(signum)  # (it would restore the default at its own end)
        signal.signal(signum, signal.SIG_IGN)


def reserved_signal() -> int | None:
    """The signal the supervisor named, when it is a real-time one (nothing else is taken)."""
    text = os.environ.get(STACKS_ENV, "")
    if not text.isdigit():
        return None
    signum = int(text)
    rtmin, rtmax = int(getattr(signal, "SIGRTMIN", 34)), int(getattr(signal, "SIGRTMAX", 64))
    return signum if rtmin <= signum <= rtmax else None
