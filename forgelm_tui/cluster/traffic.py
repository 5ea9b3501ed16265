"""What one node writes to the control store and reads from it: the ticker thread's side of
the link (cluster/link.py), with no event loop, so that the traffic rules can be tested on a
fake store (docs/multinode.md, "What it costs").

- every node writes its heartbeat (``beat/<i>``, a fixed size) each interval;
- node 0 reads every heartbeat, the finals announced, the viewers' count, and writes the
  summary (cluster/summary.py); every other node reads that summary only;
- a stop or an escalation is written once (first writer wins) and broadcast: two more calls,
  whatever the number of nodes (and a push to node 0's queue from any other node); a stop
  that is not a stall's also sets the alarm every node waits on (cluster/alarm.py): one more;
- rank details only while some node shows them: rows while any node views, a node's ranks
  while a view opened it (cluster/views.py); a node reads who opened it (``watch/<i>``) only
  while some node views.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forgelm_tui.cluster.store import ControlStore
from forgelm_tui.cluster.views import VIEW_EVERY, ViewReader
from forgelm_tui.engine.events import NodeState
from forgelm_tui.engine.node_summary import Watch
from forgelm_tui.verdict import StopKind

ALARM = "alarm"  # set by a stop's publisher; every node's alarm thread waits for it

Wire = dict[str, Any]


@dataclass
class Poll:
    """What one poll read, for the event loop."""

    beats: dict[int, Wire] = field(default_factory=dict)  # node 0: every other node's
    finals: dict[int, Wire] = field(default_factory=dict)  # node 0: the ones not read before
    summary: Wire | None = None  # any other node: node 0's
    stop: Wire | None = None  # the agreed stop, when this node did not know it
    kill: Wire | None = None
    viewers: int = 0  # node 0: nodes that show rank details
    watchers: int | None = None  # views that opened this node (None: not read this time)
    views: dict[int, tuple[NodeState, Wire]] = field(default_factory=dict)  # rows and views


class Traffic:
    def __init__(self, me: int, nnodes: int) -> None:
        self.me = me
        self.reader = ViewReader(n for n in range(nnodes) if n != me)
        self.finals_due: set[int] = set()  # announced (node 0), not read yet
        self._finals_read: set[int] = set()
        self._beating: set[int] = set()  # nodes whose heartbeat key exists
        self._summary_seen = False
        self._registered = False  # counted in the store's viewers
        self._watchers_at = float("-inf")  # when this node last read who opened it

    # ------------------------------------------------------------------ writes

    def publish(self, store: ControlStore, kind: str, payload: Any) -> None:
        if kind == "beat":
            store.set(f"beat/{self.me}", payload)
        elif kind == "summary":
            store.set("summary", payload)
        elif kind in ("row", "view"):
            store.set(f"{kind}/{self.me}", payload)
        elif kind == "final":
            store.set(f"final/{self.me}", payload)
            store.push("inbox/0", {"kind": "final", "node": self.me})  # node 0 reads it now
        elif kind == "first-failure":
            store.first(kind, payload)
        elif kind in ("stop", "kill") and store.first(kind, payload) == payload:
            if kind == "stop" and payload.get("kind") != StopKind.STALL.value:
                store.set(ALARM, 1)  # every node's SIGTERM pass, one round trip (cluster/alarm.py)
            message = {"kind": kind, kind: payload}
            store.broadcast(message)  # the first writer tells everyone now: one write
            if self.me != 0:
                store.push("inbox/0", message)

    # ------------------------------------------------------------------ reads

    def poll(self, store: ControlStore, now: float, watch: Watch, stop_known: bool,
             kill_known: bool) -> Poll:
        """``watch``: what the views on this node show (cluster/views.py)."""
        self._register(store, watch)
        if self.me == 0:
            poll = self._beats(store, stop_known, kill_known)
            viewers = poll.viewers
        else:
            poll = self._summary(store, stop_known, kill_known)
            viewers = int((poll.summary or {}).get("viewers", 0))
        if viewers - watch.viewing > 0 and now - self._watchers_at >= VIEW_EVERY:
            self._watchers_at = now  # someone else views: who opened this node
            poll.watchers = store.add(f"watch/{self.me}", 0)
        if watch.viewing and self.reader.due(now):
            poll.views = self._views(store, poll.beats if self.me == 0 else self._read_beats(store))
        return poll

    def _register(self, store: ControlStore, watch: Watch) -> None:
        """Count this node in the store's viewers while it views (node 0's summary tells every
        node: they write their rows), and in ``watch/<n>`` of each node it opened."""
        if watch.viewing != self._registered:
            store.add("viewers", 1 if watch.viewing else -1)
            self._registered = watch.viewing
            self.reader.reset()
        opened = watch.opened(self.reader.nodes)
        for node in sorted(opened ^ self.reader.opened):  # each counted once, as it is added
            store.add(f"watch/{node}", 1 if node in opened else -1)
            self.reader.open(node, node in opened)

    def _beats(self, store: ControlStore, stop_known: bool, kill_known: bool) -> Poll:
        """Node 0: every heartbeat, the finals announced (or shown done in a heartbeat), the
        viewers' count, and the stop and kill records."""
        beats = self._read_beats(store)
        done = {n for n, beat in beats.items() if beat.get("phase") == NodeState.DONE.value}
        due = [n for n in sorted((self.finals_due | done) - self._finals_read)
               if store.has([f"final/{n}"])]
        finals = dict(zip(due, store.many([f"final/{n}" for n in due]), strict=True)) \
            if due else {}
        self._finals_read.update(finals)
        self.finals_due -= set(finals)
        return Poll(beats=beats, finals=finals,
                    stop=store.get("stop") if not stop_known and store.has(["stop"]) else None,
                    kill=store.get("kill") if not kill_known and store.has(["kill"]) else None,
                    viewers=store.add("viewers", 0))

    def _summary(self, store: ControlStore, stop_known: bool, kill_known: bool) -> Poll:
        """Any other node: node 0's summary, and the stop or kill it says exists when this
        node missed their broadcast."""
        if not self._summary_seen:
            self._summary_seen = store.has(["summary"])
        summary = store.get("summary") if self._summary_seen else None
        poll = Poll(summary=summary)
        if summary is not None and summary.get("stop") and not stop_known:
            poll.stop = store.get("stop")
        if summary is not None and summary.get("kill") and not kill_known:
            poll.kill = store.get("kill")
        return poll

    def _read_beats(self, store: ControlStore) -> dict[int, Wire]:
        for node in self.reader.nodes:  # a node's first beat may come after this first poll
            if node not in self._beating and store.has([f"beat/{node}"]):
                self._beating.add(node)
        beating = sorted(self._beating)
        return dict(zip(beating, store.many([f"beat/{n}" for n in beating]),
                        strict=True)) if beating else {}

    def _views(self, store: ControlStore,
               beats: dict[int, Wire]) -> dict[int, tuple[NodeState, Wire]]:
        """The views of the opened nodes and the rows of the others, where their counter moved."""
        due = self.reader.changed(beats)
        if not due:
            return {}
        read = store.many([f"{kind}/{node}" for kind, node in due])
        return self.reader.states({node: wire for (_, node), wire in zip(due, read, strict=True)},
                                  beats)
