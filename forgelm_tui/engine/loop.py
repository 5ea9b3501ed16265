"""The event loop a run gets: epoll, with a rank's exit first in every batch of ready files.

A failing rank has usually just written (a traceback, its last lines), and other ranks print on:
one wake of the loop often finds output and a pidfd ready together, and asyncio runs the
callbacks in the kernel's order, so the output's work would come between the exit and the
peers' SIGTERM. Here the pidfds are taken first; the exit handler reads what the rank left in
its pipes itself, after the signals and before it says the rank ended (Supervisor._on_exit),
so views see the same order either way. (A rank's exit itself wakes nobody for its pipes: the
supervisor holds their write ends until it has reaped the rank, spawn.OutputPipes.)

Loops made elsewhere (a test's, a foreign host's) keep the kernel's order: ``exits_first``
is then a no-op and only the peers' SIGTERM can come a few hundred microseconds later.
"""

from __future__ import annotations

import asyncio
import selectors
import weakref

_FIRST: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[int]] = \
    weakref.WeakKeyDictionary()


class ExitsFirstSelector(selectors.EpollSelector):
    def __init__(self) -> None:
        super().__init__()
        self.first: set[int] = set()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        if len(ready) > 1 and self.first:
            ready.sort(key=lambda item: item[0].fd not in self.first)  # stable: else in order
        return ready


def new_loop() -> asyncio.AbstractEventLoop:
    selector = ExitsFirstSelector()
    loop = asyncio.SelectorEventLoop(selector)
    _FIRST[loop] = selector.first
    return loop


def exits_first(loop: asyncio.AbstractEventLoop, fd: int, first: bool = True) -> None:
    """Take ``fd`` before the other ready files of a batch (or no longer, with False)."""
    fds = _FIRST.get(loop)
    if fds is None:
        return
    if first:
        fds.add(fd)
    else:
        fds.discard(fd)
