"""The control plane while a multi-node run lasts (SPEC §8), for one node: three threads, each
with its own store connection (made while joining: cluster/join.py). The *inbox* wakes at once
when a stop, an escalation or the verdict is published (node 0 pops ``inbox/0``: stops,
escalations, finals, a node waiting to join; every other node reads the broadcast ``bcast/<n>``:
one write reaches every node). The *publisher* writes stops, escalations, the first failure and
the final, never behind a heartbeat; the *ticker* writes this node's heartbeat (node 0's summary
too, rank details while someone views them) and reads what this node needs: node 0 every
heartbeat and final, another node node 0's summary (cluster/summary.py); rank details
(``row/<i>``, ``view/<i>``) only a node that shows them, at most once a second, when changed
(cluster/views.py). What they learn is posted to the event loop, where all decisions are taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from forgelm_tui.cluster.alarm import alarm_thread
from forgelm_tui.cluster.join import ClusterConfig, Membership
from forgelm_tui.cluster.liveness import Liveness
from forgelm_tui.cluster.store import (
    BroadcastReader,
    Connections,
    ControlStore,
    StoreLost,
    StoreTimeout,
)
from forgelm_tui.cluster.summary import ClusterView, LinkPeers, NodeBeat, summarise
from forgelm_tui.cluster.traffic import Poll, Traffic
from forgelm_tui.cluster.views import ViewReader, ViewWriter
from forgelm_tui.cluster.wire import others_stop, remote_stop, stall_to_wire, stop_to_wire
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import NodeState
from forgelm_tui.engine.node_summary import NOTHING, Watch
from forgelm_tui.engine.records import StopRecord
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.verdict import StopKind

INBOX_WAIT = 1.0  # one blocking read; the thread checks for shutdown between reads
TICK_WAIT = 2.0  # one call of the ticker's connection (a fresh one after a call timed out)


class NodeLink:
    def __init__(self, supervisor: Supervisor, membership: Membership, config: ClusterConfig,
                 store: ControlStore, peers: LinkPeers, watching: Callable[[], Watch] =
                 lambda: NOTHING, spares: Sequence[ControlStore] = ()) -> None:
        self.sup = supervisor
        self.me = membership.node_rank
        self.nnodes = membership.nnodes
        self.nproc = {n.node_rank: n.nproc for n in membership.nodes}
        self.config = config
        self.store = store
        store.set_timeout(TICK_WAIT)  # the join's connection, the publisher's from now on
        # made while joining: the inbox's, ticker's, alarm's; then new ones (a call timed out)
        self._connections = Connections(store, spares, "127.0.0.1" if self.me == 0
                                        else config.store_host, config.store_port,
                                        config.node_timeout)
        self.host = socket.gethostname()
        self.interval = min(0.5, max(0.05, config.node_timeout / 10))
        others = [n for n in range(self.nnodes) if n != self.me]
        now = time.monotonic()
        # node 0 follows every node's heartbeat; the others follow node 0's summary
        self.liveness = Liveness(others if self.me == 0 else [], config.node_timeout, now)
        self.cluster = None if self.me == 0 else ClusterView(self.me, config.node_timeout, now)
        peers.source = self.liveness if self.cluster is None else self.cluster
        self.watching = watching
        self.watch = NOTHING  # what it returned last (the ticker reads this reference)
        self.views = ViewWriter(self.me, self.host)
        self.traffic = Traffic(self.me, self.nnodes)  # ticker thread only
        self.viewers = 0  # node 0: nodes that show rank details (the store's counter)
        self.watchers = 0  # views on other nodes that opened this one (``watch/<i>``)
        self.finals: dict[int, dict[str, Any]] = {}
        self.store_lost: str | None = None
        self.agreed_stop: dict[str, Any] | None = None
        self.verdict_ready = asyncio.Event()
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()  # the ticker's
        # stops, escalations, first failure, final: own thread, never behind a beat's calls
        self._urgent: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seq = 0
        self._phase = NodeState.RUNNING
        self._kill_seen = self._failure_told = False
        self._beat_handle: asyncio.TimerHandle | None = None
        self._next: tuple[NodeBeat, tuple[int, int], dict[str, Any] | None] = (
            NodeBeat(self.me, NodeState.RUNNING, 0, None, {}), (0, 0), None)
        self.failure_seen: float | None = None  # when this node first knew of a failure stop

    # ------------------------------------------------------------------ lifetime

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sup.subscribe(self.on_event, urgent=True)  # a stop's broadcast before view work
        self._beat()  # the first heartbeat's content, before the ticker's first tick
        for name, target in (("inbox", self._inbox_thread), ("ticker", self._ticker_thread),
                             ("publisher", self._publisher_thread)):
            thread = threading.Thread(target=target, name=f"forgelm-tui-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        threading.Thread(target=alarm_thread, name="forgelm-tui-alarm", daemon=True, args=(
            self.sup, self._connections, self.me, self._closed, self._post)).start()  # not joined

    def close(self) -> None:
        """Stop the threads (node 0's inbox: by a message to itself; the others' in a wait)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._beat_handle is not None:
            self._beat_handle.cancel()
        self._commands.put(("quit", None))
        self._urgent.put(("quit", None))
        for thread in self._threads if self.me == 0 else self._threads[1:]:
            thread.join(timeout=INBOX_WAIT + 1.0)

    # ------------------------------------------------------------------ loop side: out

    def on_event(self, event: ev.Event) -> None:
        stop = self.sup.stop
        if isinstance(event, ev.RunStalled) and stop is None:  # declared here: stacks first
            self._urgent.put(("stop", stall_to_wire(event.seconds, self.sup.spec.grace, self.me)))
        elif isinstance(event, ev.RunStopping) and stop is not None and stop.origin_node == self.me:
            if stop.kind is StopKind.FAILURE and self.failure_seen is None:
                self.failure_seen = time.monotonic()
            self._urgent.put(("stop", stop_to_wire(stop)))
            os.sched_yield()  # the GIL to the publisher now, not after the views' work
        elif isinstance(event, ev.RankExited) and not self._failure_told:
            record = self.sup.records.get(event.rank)
            if record is not None and record.ending().failed_on_own:
                self._failure_told = True  # the first one here; the store keeps the first of all
                # after this pass of events: the stop record it causes goes out first
                self.loop.call_soon(self._urgent.put,
                                    ("first-failure", {"rank": event.rank, "node": self.me}))
        elif isinstance(event, ev.RunEscalated) and not self._kill_seen:
            self._kill_seen = True
            self._urgent.put(("kill", {"reason": event.reason, "node": self.me}))

    def publish_final(self, final: dict[str, Any]) -> None:
        self._phase = NodeState.DONE
        if self.me != 0:  # node 0 decides with its own records
            self._urgent.put(("final", final))
        self._beat(reschedule=False)
        self._commands.put(("tick", None))  # its end at once, not at the next tick

    def _beat(self, reschedule: bool = True) -> None:
        """What the next heartbeat says (the ticker numbers it: a held-up loop is no silence)."""
        records = list(self.sup.records.values())
        now = time.monotonic()
        own = NodeBeat.of(self.me, self._phase, records, now)
        self.watch = self.watching()  # on the loop: the views' state is the loop's
        if self.views.due(now, self._viewers()):
            for kind, wire in self.views.write(self._phase, records, self.watchers):
                self._commands.put((kind, wire))
        summary = None
        if self.cluster is None:
            summary = {**summarise(0, own, self.liveness, now, self.viewers,
                                   stop=self.agreed_stop is not None, kill=self._kill_seen),
                       "host": self.host}
        self._next = (own, (self.views.rseq, self.views.vseq), summary)  # read whole
        if reschedule and not self._closed.is_set():
            self._beat_handle = self.loop.call_later(self.interval, self._beat)

    def _tick(self, store: ControlStore) -> None:
        """The ticker thread: this node's heartbeat (node 0's summary too), then its reads."""
        own, counters, summary = self._next
        self._seq += 1
        self.traffic.publish(store, "beat", own.wire(self._seq, self.host, *counters))
        if summary is not None:
            self.traffic.publish(store, "summary", {**summary, "seq": self._seq})
        self._poll(store)

    def _poll(self, store: ControlStore) -> None:
        self._post(self._on_poll, self.traffic.poll(
            store, time.monotonic(), self.watch, stop_known=self.agreed_stop is not None,
            kill_known=self._kill_seen))

    def _viewers(self) -> int:
        """Other nodes that show rank details (node 0's count, a tick old, less this one's)."""
        viewers = self.viewers if self.cluster is None else self.cluster.viewers
        return viewers - (1 if self.watch.viewing else 0)

    # ------------------------------------------------------------------ loop side: in

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        if not self._closed.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed under us: run over
                self.loop.call_soon_threadsafe(callback, *args)

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "stop":
            self._remote_stop(message["stop"])
        elif kind == "kill":
            self._remote_kill(message["kill"])
        elif kind == "verdict":
            if self.cluster is not None:
                self.cluster.open = 0  # every node is done or lost: node 0 decided
                self.sup.peers_changed()
            self.verdict_ready.set()
        elif kind == "waiting" and self.nnodes < self.config.nnodes:  # node 0, elastic
            self._stop_here(StopKind.MEMBERSHIP, "a node is waiting to join (--nnodes "
                            f"{self.config.min_nodes}:{self.config.nnodes})", "node joining")

    def _remote_stop(self, data: dict[str, Any]) -> None:
        self.agreed_stop = self.agreed_stop or data
        if data.get("origin_node") == self.me:
            return  # its own (a stall's, read back while its stacks are captured)
        if data.get("kind") == StopKind.FAILURE.value and self.failure_seen is None:
            self.failure_seen = time.monotonic()
        if self.sup.stop is None:
            self.sup.apply_stop(remote_stop(data))

    def _remote_kill(self, data: dict[str, Any]) -> None:
        if not self._kill_seen:
            self._kill_seen = True
            self.sup.apply_kill(f"{data['reason']} (on node {data['node']})")

    def _on_poll(self, poll: Poll) -> None:
        if self.cluster is None:
            self._on_beats(poll)
        else:
            self._on_summary(poll)
        if poll.watchers is not None:
            self.watchers = poll.watchers
        for node, (state, view) in poll.views.items():
            self._show(node, state, view)

    def _on_beats(self, poll: Poll) -> None:
        """Node 0: every other node's heartbeat and the finals it has not read yet."""
        now = time.monotonic()
        self.viewers = poll.viewers
        for node, beat in poll.beats.items():
            if self.liveness.beat(node, beat, now):
                self._show(node, self.liveness.peers[node].state)
        for node, final in poll.finals.items():
            self.finals[node] = final
            self.liveness.done(node)
            self._show(node, NodeState.DONE, final.get("view"))
        self._remote(poll)
        lost = self.liveness.check(now)
        for node in lost:
            self._node_lost(node, f"node {node} lost: no heartbeat for "
                                  f"{self.config.node_timeout:g} s")
        if poll.finals or lost:
            self.sup.peers_changed()

    def _on_summary(self, poll: Poll) -> None:
        """Any node but 0: node 0's summary (None: not written yet)."""
        cluster, now = self.cluster, time.monotonic()
        assert cluster is not None
        was_live = cluster.live()
        if poll.summary is not None and cluster.read(poll.summary, now):
            self._show(0, cluster.state)
        self._remote(poll)
        if cluster.check(now):
            self._node_lost(0, f"node 0 lost: no heartbeat for {self.config.node_timeout:g} s")
        if was_live and not cluster.live():
            self.sup.peers_changed()

    def _remote(self, poll: Poll) -> None:
        """A stop or escalation this node missed in its inbox, read in a poll."""
        if poll.stop is not None:
            self._remote_stop(poll.stop)
        if poll.kill is not None:
            self._remote_kill(poll.kill)

    def _show(self, node: int, state: NodeState, view: Any = None) -> None:
        host = self.traffic.reader.hosts.get(node, "")
        if node in self.liveness.peers:
            host = self.liveness.peers[node].host or host
        elif node == 0 and self.cluster is not None:
            host = self.cluster.host or host
        got = ViewReader.decode(view)  # None: its state alone changed
        self.sup.emit(ev.NodeChanged(node, host, state, (), time.time()) if got is None else
                      dataclasses.replace(got, host=host or got.host, state=state, at=time.time()))

    def _node_lost(self, node: int, reason: str) -> None:
        self._show(node, NodeState.LOST)
        self._stop_here(StopKind.NODE_LOST, reason, f"node {node}", node)

    def _stop_here(self, kind: StopKind, why: str, origin: str, lost: int | None = None) -> None:
        """A stop this node decides (published by on_event, as any stop that began here)."""
        if self.sup.stop is None:
            self.sup.apply_stop(StopRecord(kind, why, origin, None, time.time(), 0.0,
                                           grace=self.sup.spec.grace, origin_node=self.me,
                                           lost_node=lost))

    def lost_before_failure(self) -> tuple[int, tuple[int, ...]] | None:
        """The node whose loss the first failure stop is collateral of, and its ranks (§10)."""
        if self.failure_seen is None:
            return None
        source = self.liveness if self.cluster is None else self.cluster
        node = source.silent_before(self.failure_seen, 2 * self.interval)
        if node is None:
            return None
        first = sum(self.nproc.get(n, 0) for n in range(node))
        return node, tuple(range(first, first + self.nproc.get(node, 0)))

    def _store_gone(self, message: str) -> None:
        """The control store is unreachable: node 0 is gone (or the network to it)."""
        if self.store_lost is not None or self._closed.is_set():
            return
        self.store_lost = message
        if self.cluster is not None and self.cluster.lose():
            self._node_lost(0, f"node 0 lost: the control store is unreachable ({message})")
        for node in self.liveness.lose_all():
            self._show(node, NodeState.LOST)
        self.verdict_ready.set()
        self.sup.peers_changed()

    # ------------------------------------------------------------------ threads

    def _inbox_thread(self) -> None:
        try:
            inbox = self._connections.spare(INBOX_WAIT)
        except (StoreLost, StoreTimeout) as exc:
            self._post(self._store_gone, str(exc))
            return
        broadcasts = BroadcastReader(inbox) if self.me != 0 else None
        while not self._closed.is_set():
            try:
                message = (inbox.pop(f"inbox/{self.me}", INBOX_WAIT) if broadcasts is None
                           else broadcasts.read(INBOX_WAIT))
            except (StoreLost, StoreTimeout) as exc:
                self._post(self._store_gone, str(exc))
                return
            if message is None or message.get("kind") == "quit":
                continue
            if message.get("kind") == "final":
                self._commands.put(("final-of", message.get("node")))  # read it at once
                continue
            if message.get("kind") == "stop" and (early := others_stop(message, self.me)):
                self.sup.early_stop(early)  # its SIGTERM pass now, or the alarm's pass's record
                self._post(self.sup.early_exits)  # (engine/early_stop.py, cluster/alarm.py)
            self._post(self._on_message, message)

    def _ticker_thread(self) -> None:
        """Heartbeats and polls, every interval, and rank details while someone views them.
        A store that answers late (node 0 starved of CPU) is not node 0 gone: a call that
        times out is retried on a fresh connection (a late answer would be read as the next
        call's) until the node timeout passes with none answered; a refused or reset
        connection is node 0 gone at once."""
        store = None
        answered = next_tick = time.monotonic()
        while True:
            try:
                kind, payload = self._commands.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                kind, payload = "tick", None
            if kind == "quit":
                return
            if kind == "tick":
                next_tick = time.monotonic() + self.interval
            try:
                store = store or self._connections.spare(TICK_WAIT)
                if kind == "tick":
                    self._tick(store)
                elif kind == "final-of":
                    self.traffic.finals_due.add(payload)
                    self._poll(store)
                else:
                    self.traffic.publish(store, kind, payload)
                answered = time.monotonic()
            except StoreLost as exc:
                return self._post(self._store_gone, str(exc))
            except StoreTimeout as exc:
                if time.monotonic() - answered >= self.config.node_timeout:
                    return self._post(self._store_gone, str(exc))
                store = None  # a fresh connection for the next call

    def _publisher_thread(self) -> None:
        """Stops, escalations, the first failure and the final, in order, each until written
        (the same rule for a late store as the ticker's), on the join's connection."""
        store, answered = self.store, time.monotonic()
        while True:
            kind, payload = self._urgent.get()
            while True:
                try:
                    if kind == "quit":
                        if self.me == 0:  # wake node 0's inbox thread
                            with contextlib.suppress(StoreLost, StoreTimeout):
                                store.push("inbox/0", {"kind": "quit"})
                        return
                    self.traffic.publish(store, kind, payload)
                    answered = time.monotonic()
                    break
                except StoreLost as exc:
                    return self._post(self._store_gone, str(exc))
                except StoreTimeout as exc:
                    if time.monotonic() - answered >= self.config.node_timeout:
                        return self._post(self._store_gone, str(exc))
                    with contextlib.suppress(StoreLost, StoreTimeout):
                        store = self._connections.connect(TICK_WAIT)
