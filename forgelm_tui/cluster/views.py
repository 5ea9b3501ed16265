"""Rank details between nodes, only for nodes that show them (issue 23; docs/multinode.md).

A node's heartbeat says nothing of its ranks but a view counter (``vseq``). While some other
node shows rank details (its TUI, an attached viewer: node 0's summary counts them), a node
writes its ranks' snapshots to ``view/<i>`` at most once a second, and only when they changed
(``vseq`` moves). A node that shows them reads the heartbeats at most once a second and the
views whose counter moved. A headless node with no attached viewer reads none and, while
nobody views, none is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from typing import Any

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.codec import DecodeError, from_wire, to_wire
from forgelm_tui.engine.events import NodeState
from forgelm_tui.engine.records import RankRecord

VIEW_EVERY = 1.0  # at most one view a node a second, written or read
# A view carries its ranks' curves (metrics_history, ~3 KB a rank) only when a viewer came
# (the counter grew) and every CURVE_EVERY views; between, the viewer grows each curve from the
# views' own step and metrics (tui/model.py): ~7x fewer bytes while someone views (a rank
# with a 200-point curve: ~3.3 KB with it, ~450 B without).
CURVE_EVERY = 30

Wire = dict[str, Any]


class ViewWriter:
    """This node's ranks as a view, when due and changed (the event loop's side)."""

    def __init__(self, me: int, host: str) -> None:
        self.me, self.host = me, host
        self.seq = 0  # the view counter its heartbeat carries
        self._last: Wire | None = None
        self._at = float("-inf")
        self._viewers = 0
        self._since_curves = 0

    def due(self, now: float, wanted: bool) -> bool:
        if not wanted:
            self._viewers = 0  # nobody views: whoever comes next is new (gets the curves)
            return False
        if now - self._at < VIEW_EVERY:
            return False
        self._at = now
        return True

    def view(self, phase: NodeState, records: Iterable[RankRecord],
             viewers: int = 0) -> Wire | None:
        """The view to write, or None when it is the one written last. ``viewers``: how many
        nodes view (a new one gets the curves in the next view)."""
        curves = viewers > self._viewers or self._since_curves >= CURVE_EVERY
        self._viewers = viewers
        ranks = tuple(r.snapshot() for r in records)
        if not curves:
            ranks = tuple(dataclasses.replace(s, metrics_history=()) for s in ranks)
        wire = to_wire(ev.NodeChanged(self.me, self.host, phase, ranks, 0.0))
        if wire == self._last:
            return None
        self._last = wire
        self.seq += 1
        self._since_curves = 0 if curves else self._since_curves + 1
        return wire


class ViewReader:
    """Which other nodes' views to read (the ticker's side) and what they hold."""

    def __init__(self, nodes: Iterable[int]) -> None:
        self.nodes = list(nodes)
        self.hosts: dict[int, str] = {}
        self._seen: dict[int, int] = {}
        self._at = float("-inf")

    def due(self, now: float) -> bool:
        if now - self._at < VIEW_EVERY:
            return False
        self._at = now
        return True

    def reset(self) -> None:
        """Read every view again (a new viewer starts from what each node shows now)."""
        self._seen.clear()

    def changed(self, beats: dict[int, Wire]) -> list[int]:
        """Nodes whose view counter moved since this reader's last read of their view."""
        nodes = []
        for node, beat in sorted(beats.items()):
            self.hosts[node] = str(beat.get("host", ""))
            seq = beat.get("vseq", 0)
            if isinstance(seq, int) and seq > self._seen.get(node, 0):
                self._seen[node] = seq
                nodes.append(node)
        return nodes

    @staticmethod
    def states(views: dict[int, Wire], beats: dict[int, Wire]) -> dict[int, tuple[NodeState, Wire]]:
        found = {}
        for node, view in views.items():
            with contextlib.suppress(ValueError):
                found[node] = (NodeState(beats[node].get("phase", "running")), view)
        return found

    @staticmethod
    def ranks(view: Any) -> tuple[ev.RankSnapshot, ...]:
        if isinstance(view, dict):
            with contextlib.suppress(DecodeError):
                decoded = from_wire(view)
                if isinstance(decoded, ev.NodeChanged):
                    return decoded.ranks
        return ()
