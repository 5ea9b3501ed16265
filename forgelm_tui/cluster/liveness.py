"""Who is still there: pure bookkeeping of other nodes' heartbeats, on this node's clock.

A node is lost when its heartbeat counter has not moved for the node timeout, measured with
this machine's monotonic clock from when the counter was last seen to change: two machines'
clocks are never compared. A node that published its final records is done, never lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forgelm_tui.engine import hang
from forgelm_tui.engine.events import NodeState


@dataclass
class PeerView:
    node_rank: int
    host: str = ""
    seq: int = -1
    seen_mono: float = 0.0  # when seq last changed (this node's clock)
    state: NodeState = NodeState.JOINING
    progress_age: float | None = None  # youngest progress among its live ranks, as reported
    live_ranks: int = 0
    collectives: hang.Bounds = field(default_factory=dict)  # its ranks' lowest, highest counts


class Liveness:
    def __init__(self, peers: list[int], timeout: float, now: float) -> None:
        self.timeout = timeout
        self.peers = {n: PeerView(n, seen_mono=now) for n in peers}

    def beat(self, node: int, beat: dict[str, Any], now: float) -> bool:
        """A heartbeat read from the store; True when the node's state changed."""
        peer = self.peers[node]
        if peer.state in (NodeState.LOST, NodeState.DONE):
            return False
        changed = False
        if beat.get("seq", -1) != peer.seq:
            peer.seq, peer.seen_mono = beat.get("seq", -1), now
            peer.progress_age = beat.get("progress_age")
            peer.live_ranks = int(beat.get("live", 0))
            peer.collectives = hang.from_wire(beat.get("collectives"))
            peer.host = beat.get("host", peer.host)
        state = NodeState(beat.get("phase", "joining"))
        if state is NodeState.DONE:  # done once its final is read (done()), never before:
            state = NodeState.RUNNING  # the verdict needs every node's records
        if state is not peer.state:
            peer.state, changed = state, True
        return changed

    def done(self, node: int) -> None:
        peer = self.peers[node]
        if peer.state is not NodeState.LOST:
            peer.state = NodeState.DONE
            peer.live_ranks = 0

    def check(self, now: float) -> list[int]:
        """Nodes newly lost at ``now``."""
        lost = []
        for peer in self.peers.values():
            if peer.state in (NodeState.LOST, NodeState.DONE):
                continue
            if now - peer.seen_mono >= self.timeout:
                peer.state = NodeState.LOST
                peer.live_ranks = 0
                lost.append(peer.node_rank)
        return lost

    def silent_before(self, failure_at: float, slack: float) -> int | None:
        """Of the lost nodes, the first to go silent, if its last sign of life came before
        ``failure_at`` (``slack``: how late a heartbeat may be read). A failure after a node's
        last beat is collateral of that node's loss: its loss is declared within the node
        timeout after the failure (SPEC §10). Both times are this node's clock."""
        silent = [p for p in self.peers.values()
                  if p.state is NodeState.LOST and p.seen_mono - slack <= failure_at]
        return min(silent, key=lambda p: p.seen_mono).node_rank if silent else None

    def lose_all(self) -> list[int]:
        """The store itself is gone: nobody can be heard any more."""
        lost = [p.node_rank for p in self.peers.values()
                if p.state not in (NodeState.LOST, NodeState.DONE)]
        for node in lost:
            self.peers[node].state = NodeState.LOST
            self.peers[node].live_ranks = 0
        return lost

    def live(self) -> bool:
        """Some other node still has ranks running, or has not yet reported their end."""
        return any(p.state in (NodeState.JOINING, NodeState.RUNNING)
                   for p in self.peers.values())

    def progress_age(self, now: float) -> float | None:
        """The youngest progress among other nodes' live ranks, aged by the time since their
        heartbeat was read; None when no other node reports a live rank."""
        ages = [p.progress_age + (now - p.seen_mono) for p in self.peers.values()
                if p.state is NodeState.RUNNING and p.progress_age is not None and p.live_ranks]
        return min(ages) if ages else None

    def collective_bounds(self) -> hang.Bounds:
        """The lowest and highest collective count per group of other nodes' live ranks, as
        their last heartbeats said (engine/hang.py)."""
        return hang.merge(p.collectives for p in self.peers.values()
                          if p.state is NodeState.RUNNING and p.live_ranks)
