"""What node 0 tells every other node once a heartbeat interval: the cluster in a fixed size.

Every node writes its own small heartbeat (``beat/<i>``); node 0 alone reads them all (it
decides liveness and the verdict anyway) and writes one summary (``summary``) that every other
node reads: the store carries O(nodes) a second, not a read of every beat by every node
(docs/multinode.md, "What it costs"). What a node's policy needs of the others is in it, as
durations on node 0's clock (two machines' clocks are never compared):

- ``open``: how many nodes still have ranks running or are joining, node 0 included, and
  ``open_one``, which one when it is one (a node tells whether *another* node is open);
- ``ages``: the two youngest progress ages and their nodes (a node's stall rule takes the
  youngest that is not its own);
- ``collectives``: every node's lowest and highest count per group, merged (the hang rule);
- ``viewers``: how many nodes show rank details (a TUI, an attached viewer): nodes publish
  their ranks' details only while it is not 0;
- ``stop``, ``kill``: node 0 knows the agreed stop or escalation (a node that missed the
  broadcast reads it then).

A node other than 0 keeps a :class:`ClusterView` of the summaries: node 0 is lost when the
summary's counter has not moved for the node timeout (on the reader's clock), as a beat's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from forgelm_tui.cluster.liveness import Liveness
from forgelm_tui.engine import hang
from forgelm_tui.engine.events import NodeState
from forgelm_tui.engine.records import RankRecord

OPEN = (NodeState.JOINING, NodeState.RUNNING)


@dataclass(frozen=True)
class NodeBeat:
    """A node's own heartbeat: a fixed size, whatever its ranks and their metrics."""

    node: int
    state: NodeState
    live: int
    progress_age: float | None  # its youngest live rank's
    collectives: hang.Bounds  # its live ranks' lowest and highest count per group

    @classmethod
    def of(cls, node: int, state: NodeState, records: Iterable[RankRecord],
           now: float) -> NodeBeat:
        live = [r for r in records if r.alive]
        ages = [r.progress_age(now) for r in live]
        return cls(node, state, len(live), min(ages) if ages else None, hang.bounds(live))

    def wire(self, seq: int, host: str, rseq: int = 0, vseq: int = 0) -> dict[str, Any]:
        """``beat/<i>``: ``rseq`` and ``vseq`` count the node's rows and views
        (cluster/views.py)."""
        return {"seq": seq, "phase": self.state.value, "host": host, "live": self.live,
                "progress_age": self.progress_age, "collectives": hang.to_wire(self.collectives),
                "rseq": rseq, "vseq": vseq}


def summarise(seq: int, own: NodeBeat, liveness: Liveness, now: float, viewers: int,
              stop: bool, kill: bool) -> dict[str, Any]:
    """Node 0's summary of every node at ``now`` (its clock): its own state and the others'
    last heartbeats, their ages grown by the time since each was read."""
    states = {own.node: own.state, **{n: p.state for n, p in liveness.peers.items()}}
    open_nodes = [n for n, state in states.items() if state in OPEN]
    ages = [(own.progress_age, own.node)] if own.live and own.progress_age is not None else []
    ages += [(p.progress_age + (now - p.seen_mono), n) for n, p in liveness.peers.items()
             if p.state is NodeState.RUNNING and p.live_ranks and p.progress_age is not None]
    youngest = sorted(ages)[:2]
    live = own.live + sum(p.live_ranks for p in liveness.peers.values()
                          if p.state is NodeState.RUNNING)
    bounds = hang.merge([own.collectives, liveness.collective_bounds()])
    return {"seq": seq, "phase": own.state.value, "open": len(open_nodes),
            "open_one": open_nodes[0] if len(open_nodes) == 1 else None,
            "ages": [[round(age, 3), node] for age, node in youngest], "live": live,
            "collectives": hang.to_wire(bounds), "viewers": max(0, viewers),
            "stop": stop, "kill": kill}


@dataclass
class ClusterView:
    """A node other than 0: the others as node 0's last summary said, on this node's clock."""

    me: int
    timeout: float
    seen_mono: float  # when the summary's counter last moved (or the view began)
    seq: int = -1
    state: NodeState = NodeState.JOINING  # node 0's
    host: str = ""  # node 0's
    open: int = 1
    open_one: int | None = None
    ages: list[tuple[float, int]] = field(default_factory=list)
    collectives: hang.Bounds = field(default_factory=dict)
    viewers: int = 0
    stop: bool = False
    kill: bool = False

    def read(self, summary: dict[str, Any], now: float) -> bool:
        """A summary read from the store; True when node 0's state changed."""
        if summary.get("seq", -1) == self.seq or self.state is NodeState.LOST:
            return False
        self.seq, self.seen_mono = summary.get("seq", -1), now
        self.open = int(summary.get("open", 0))
        self.open_one = summary.get("open_one")
        self.ages = [(float(a), int(n)) for a, n in summary.get("ages", [])]
        self.collectives = hang.from_wire(summary.get("collectives"))
        self.viewers = int(summary.get("viewers", 0))
        self.stop, self.kill = bool(summary.get("stop")), bool(summary.get("kill"))
        self.host = str(summary.get("host", self.host))
        state = NodeState(summary.get("phase", "joining"))
        changed, self.state = state is not self.state, state
        return changed

    def check(self, now: float) -> bool:
        """True once, when node 0 is newly lost: its summary stood still for the timeout.
        Node 0 publishes summaries until the verdict, its ranks over or not."""
        if self.state is NodeState.LOST or now - self.seen_mono < self.timeout:
            return False
        self.state = NodeState.LOST
        return True

    def lose(self) -> bool:
        """The store is gone, and node 0 with it; True when that is news."""
        if self.state is NodeState.LOST:
            return False
        self.state = NodeState.LOST
        return True

    # the policy's Peers

    def live(self) -> bool:
        """Another node still has ranks running or is joining (node 0's count, less this
        node when it is the one); never once node 0 is lost (this node decides alone)."""
        if self.state is NodeState.LOST:
            return False
        return self.open >= 2 or (self.open == 1 and self.open_one != self.me)

    def progress_age(self, now: float) -> float | None:
        if self.state is NodeState.LOST:
            return None
        others = [age for age, node in self.ages if node != self.me]
        return others[0] + (now - self.seen_mono) if others else None

    def collective_bounds(self) -> hang.Bounds:
        return {} if self.state is NodeState.LOST else self.collectives

    def silent_before(self, failure_at: float, slack: float) -> int | None:
        """Node 0, when it is lost and went silent before ``failure_at`` (Liveness's rule)."""
        if self.state is NodeState.LOST and self.seen_mono - slack <= failure_at:
            return 0
        return None


class LinkPeers:
    """The policy's view of other nodes (engine.policy.Peers); nobody before the join. Node 0
    sees them in their heartbeats (Liveness), any other node in node 0's summary."""

    def __init__(self) -> None:
        self.source: Liveness | ClusterView | None = None

    def live(self) -> bool:
        return self.source is not None and self.source.live()

    def progress_age(self, now: float) -> float | None:
        return None if self.source is None else self.source.progress_age(now)

    def collective_bounds(self) -> hang.Bounds:
        return {} if self.source is None else self.source.collective_bounds()
