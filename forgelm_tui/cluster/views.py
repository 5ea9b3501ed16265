"""Rank details between nodes, only for the views that show them (issue 23; docs/multinode.md).

A node's heartbeat says nothing of its ranks but two counters, ``rseq`` and ``vseq``. While
some other node has a view (its TUI, an attached viewer: node 0's summary counts them in
``viewers``), a node writes its *row* to ``row/<i>``: its ranks summed up in a fixed size
(engine/node_summary.py) and the few ranks that need reading (``notable``). Only
while some view opened the node (``watch/<i>`` counts them; the node reads its own counter at
most once a second while anyone views) does it write its *view* to ``view/<i>``: every rank's
snapshot. Each at most once a second, only when it changed (its counter moves).

A node with a view reads the heartbeats at most once a second, then the view of each node it
opened and the row of every other node whose counter moved. A headless node with no attached
viewer reads none of it and, while nobody views, none is written. A view of every rank (a run
with fewer ranks than the screen has rows) opens every node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.codec import DecodeError, from_wire, to_wire
from forgelm_tui.engine.events import NodeState, RankState
from forgelm_tui.engine.node_summary import summarise
from forgelm_tui.engine.records import RankRecord

VIEW_EVERY = 1.0  # at most one row and one view a node a second, written or read
# A view carries its ranks' curves (metrics_history, ~3 KB a rank) only when a view opened the
# node (its counter grew) and every CURVE_EVERY views; between, the viewer grows each curve
# from the views' own step and metrics (tui/model.py): ~7x fewer bytes while someone views (a
# rank with a 200-point curve: ~3.3 KB with it, ~450 B without).
CURVE_EVERY = 30

Wire = dict[str, Any]


def node_changed(me: int, host: str, phase: NodeState, records: Iterable[RankRecord],
                 complete: bool = True, curves: bool = True) -> ev.NodeChanged:
    """This node as another node's view gets it: its ranks (every one, or those that need
    reading), with or without their curves, and its summary."""
    records = list(records)
    now = time.monotonic()
    summary = summarise(r.facts(now) for r in records)
    shown = records if complete else [r for r in records if notable(r)]
    ranks = tuple(r.snapshot() for r in shown)
    if not curves or not complete:
        ranks = tuple(dataclasses.replace(s, metrics_history=()) for s in ranks)
    return ev.NodeChanged(me, host, phase, ranks, 0.0, summary, complete)


def notable(record: RankRecord) -> bool:
    """A rank a row carries besides its summary: one a closed node's row shows under it
    (tui/node_groups.py): the stall rule named it, or it failed or died on its own (never a
    stop's collateral: after a stop that would be every rank, and a row stays small)."""
    return record.stalled or (record.state in (RankState.FAILED, RankState.KILLED)
                               and not record.signalled_first)


class ViewWriter:
    """This node's row and view, when due and changed (the event loop's side)."""

    def __init__(self, me: int, host: str) -> None:
        self.me, self.host = me, host
        self.rseq = self.vseq = 0  # the counters its heartbeat carries
        self._last: dict[str, Wire] = {}
        self._at = float("-inf")
        self._watchers = 0
        self._since_curves = 0

    def due(self, now: float, viewers: int) -> bool:
        """``viewers``: how many other nodes have a view (node 0's count)."""
        if viewers <= 0:
            self._watchers = 0  # nobody views: whoever comes next is new (gets the curves)
            return False
        if now - self._at < VIEW_EVERY:
            return False
        self._at = now
        return True

    def write(self, phase: NodeState, records: Iterable[RankRecord],
              watchers: int) -> list[tuple[str, Wire]]:
        """The row, and the view while ``watchers`` (views that opened this node) is not 0,
        each only when it is not the one written last."""
        records = list(records)
        out = []
        row = self._changed("row", node_changed(self.me, self.host, phase, records, False))
        if row is not None:
            self.rseq += 1
            out.append(("row", row))
        if watchers <= 0:
            self._watchers = 0
            return out
        curves = watchers > self._watchers or self._since_curves >= CURVE_EVERY
        self._watchers = watchers
        view = self._changed("view", node_changed(self.me, self.host, phase, records,
                                                  curves=curves), force=curves)
        if view is not None:
            self.vseq += 1
            self._since_curves = 0 if curves else self._since_curves + 1
            out.append(("view", view))
        return out

    def _changed(self, kind: str, changed: ev.NodeChanged, force: bool = False) -> Wire | None:
        wire = to_wire(changed)
        if wire == self._last.get(kind) and not force:
            return None
        self._last[kind] = wire
        return wire


class ViewReader:
    """Which other nodes' rows and views to read (the ticker's side)."""

    def __init__(self, nodes: Iterable[int]) -> None:
        self.nodes = list(nodes)
        self.hosts: dict[int, str] = {}
        self.opened: set[int] = set()
        self._seen: dict[tuple[str, int], int] = {}  # ("row" or "view", node): its counter
        self._counters: dict[int, tuple[int, int]] = {}  # each node's last (rseq, vseq)
        self._at = float("-inf")

    def due(self, now: float) -> bool:
        if now - self._at < VIEW_EVERY:
            return False
        self._at = now
        return True

    def reset(self) -> None:
        """Read every row and view again (a new view starts from what each node shows now)."""
        self._seen.clear()

    def open(self, node: int, shown: bool) -> None:
        """A node whose ranks are shown now (``shown``) or no longer: one just opened is read
        from its latest view at once (then each new one: the next, written once it knows it
        is opened, has its curves), one just closed from its latest row."""
        if shown:
            self.opened.add(node)
            self._seen[("view", node)] = max(0, self._counters.get(node, (0, 0))[1] - 1)
        else:
            self.opened.discard(node)
            self._seen.pop(("row", node), None)

    def changed(self, beats: dict[int, Wire]) -> list[tuple[str, int]]:
        """("view", node) for each opened node whose view counter moved, ("row", node) for
        each other node whose row counter moved, since this reader last read it."""
        due = []
        for node, beat in sorted(beats.items()):
            self.hosts[node] = str(beat.get("host", ""))
            rseq, vseq = beat.get("rseq", 0), beat.get("vseq", 0)
            if not isinstance(rseq, int) or not isinstance(vseq, int):
                continue
            self._counters[node] = (rseq, vseq)
            kind, seq = ("view", vseq) if node in self.opened else ("row", rseq)
            if seq > self._seen.get((kind, node), 0):
                self._seen[(kind, node)] = seq
                due.append((kind, node))
        return due

    @staticmethod
    def states(views: dict[int, Wire], beats: dict[int, Wire]) -> dict[int, tuple[NodeState, Wire]]:
        found = {}
        for node, view in views.items():
            with contextlib.suppress(ValueError):
                found[node] = (NodeState(beats[node].get("phase", "running")), view)
        return found

    @staticmethod
    def decode(view: Any) -> ev.NodeChanged | None:
        if isinstance(view, dict):
            with contextlib.suppress(DecodeError):
                decoded = from_wire(view)
                if isinstance(decoded, ev.NodeChanged):
                    return decoded
        return None
