"""An elastic run's rendezvous round (``--nnodes MIN:MAX``, torchrun's c10d rule): node 0
closes it when MAX nodes joined, or when at least MIN had joined for ``last_call_timeout``
(``--rdzv-conf``, default 30 s); node ranks are the order of joining, node 0's is 0. Every
attempt is a round of its own (cluster/join.py: ``join``, ``rejoin``); a node that took a
number after the round closed is not in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from forgelm_tui.cluster.config import ClusterConfig
from forgelm_tui.cluster.store import ControlStore

POLL = 0.05


def close_round(store: ControlStore, config: ClusterConfig, clock: Callable[[], float],
                deadline: float, check: Callable[[], None],
                refuse: Callable[[str], None]) -> list[Any]:
    """Node 0: wait for the round to fill (``check`` raises on an abort or a cancel;
    ``refuse`` on too few nodes at the deadline), then publish its members."""
    low, high = config.min_nodes, config.nnodes
    since = None  # when MIN nodes had joined
    while True:
        joined = 1 + store.add("join-order", 0)  # node 0, and every node that took a number
        now = clock()
        if joined >= high:
            count = high
            break
        if joined >= low:
            since = now if since is None else since
            if now - since >= config.last_call:
                count = joined
                break
        check()
        if now >= deadline:
            refuse(f"{joined} node{'s' if joined > 1 else ''} joined within the join timeout "
                   f"of {config.join_timeout:g} s; --nnodes {low}:{high} needs {low}")
        time.sleep(POLL)
    names = [f"node/{n}" for n in range(count)]
    while not store.has(names):  # each registers right after taking its number
        check()
        if clock() >= deadline:
            refuse("a node took its number but never registered")
        time.sleep(POLL)
    members = store.many(names)
    store.set("members", members)
    return members


def late_line(config: ClusterConfig, members: int | None = None) -> str:
    """What a node too late for the round under way says while it waits for the next."""
    closed = "" if members is None else f" with {members} node{'s' if members > 1 else ''}"
    return (f"the round under way closed{closed} before this node joined it (--nnodes "
            f"{config.min_nodes}:{config.nnodes}): waiting for the next one (node 0 re-forms "
            "the run with this node when it has fewer than MAX)")
