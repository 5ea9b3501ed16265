"""Connecting to a run again after the connection dropped mid-run (the run closed it because
the viewer fell behind, or something between them failed): a few tries with a growing wait,
only while the run's socket is there and its supervisor alive. Blocking: a viewer's reader
thread calls it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from forgelm_tui.control.client import ControlClient, ControlError
from forgelm_tui.control.find import process_alive

TRIES = 8
FIRST_WAIT = 0.1  # s, doubled after each failed try, at most MAX_WAIT: about 9 s in all
MAX_WAIT = 2.0


def supervisor_alive(pid: int | None) -> bool:
    return process_alive(pid)


def connect_again(path: Path, pid: int | None, *, output: str = "tail",
                  give_up: Callable[[], bool] = lambda: False,
                  tries: int = TRIES) -> ControlClient | None:
    """A new connection (its first item is a fresh snapshot), or None: the socket is gone, the
    supervisor has exited, ``give_up()`` (the viewer detached), or every try failed."""
    wait = FIRST_WAIT
    for attempt in range(tries):
        if give_up() or not path.exists() or not supervisor_alive(pid):
            return None
        try:
            return ControlClient(path, output=output)
        except ControlError:
            if attempt + 1 < tries:
                time.sleep(wait)
            wait = min(wait * 2, MAX_WAIT)
    return None
