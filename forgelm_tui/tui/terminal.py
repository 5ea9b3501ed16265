"""The terminal the launching app draws on: is it still there, stop drawing to it, leave.

A closed terminal (ssh dropped, tmux killed) is a hang-up: the run is stopped gracefully and the
app quits once the ranks are down. Nothing here decides about the run.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

TERMINAL_CLOSED = "terminal closed (hang-up)"


class Terminal:
    def __init__(self, fd: int | None, before_exit: Callable[[], None] | None = None) -> None:
        self.fd = fd
        self.before_exit = before_exit
        self.lost = False

    def gone(self) -> bool:
        """The terminal was closed (its controlling session hung up)."""
        if self.fd is None:
            return False
        try:
            os.tcgetpgrp(self.fd)
        except OSError:
            return True
        return False

    def stop_drawing(self, driver: object | None) -> bool:
        """Draw nothing more. Textual's writer thread dies on the first write that fails (EIO on
        a hung-up terminal) and its bounded queue then blocks the next frame's write, and with
        it the loop the engine shares while it finishes the stop. So: frames are dropped
        before they reach that queue, and what is already queued goes to /dev/null.
        True the first time."""
        if self.lost:
            return False
        self.lost = True
        writer = getattr(driver, "_writer_thread", None)  # Textual 8's LinuxDriver
        if writer is not None:
            writer.write = _drop  # an instance attribute: shadows WriterThread.write
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            for fd in {1, 2, self.fd if self.fd is not None else 2}:
                os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        return True

    def hard_exit(self, code: int) -> None:
        """Nothing to restore, and Textual's own shutdown can block writing to a dead terminal.
        The envelope is already written: leave now."""
        if self.before_exit is not None:
            self.before_exit()
        os._exit(code)


def exit_on_signals(exit_app: Callable[[int], None], terminal: Terminal, code: int) -> None:
    """After the run, SIGTERM / SIGINT close the app with the run's code; SIGHUP leaves."""
    try:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, exit_app, code)
        loop.add_signal_handler(signal.SIGHUP, terminal.hard_exit, code)
    except (RuntimeError, ValueError, NotImplementedError):
        pass  # not the main thread (tests): nothing to do


def _drop(text: str) -> None:
    del text
