"""The control plane while a multi-node run lasts (SPEC §8), for one node.

Two threads, each with its own store connection:
- the *inbox* thread blocks on this node's queue and wakes at once when another node publishes
  a stop or an escalation (the record travels in the message: no second round trip);
- the *ticker* publishes what the loop hands it (this node's heartbeat, a stop record, a kill,
  the final records) and reads the others' heartbeats, finals and the stop key (a fallback for
  a missed message).
Everything they learn is posted to the event loop, where all decisions are taken: a remote
stop becomes the engine's stop command, a silent node a ``node_lost`` stop, remote ranks
``NodeChanged`` events for every view.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from forgelm_tui.cluster.join import ClusterConfig, Membership
from forgelm_tui.cluster.liveness import Liveness
from forgelm_tui.cluster.store import ControlStore, StoreLost, StoreTimeout
from forgelm_tui.cluster.wire import stop_from_wire, stop_to_wire
from forgelm_tui.engine import events as ev
from forgelm_tui.engine import hang
from forgelm_tui.engine.codec import DecodeError, from_wire, to_wire
from forgelm_tui.engine.events import NodeState
from forgelm_tui.engine.records import StopRecord
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.verdict import StopKind

INBOX_WAIT = 1.0  # one blocking pop; the thread checks for shutdown between pops
TICK_WAIT = 2.0  # one call of the ticker's connection (a fresh one after a call timed out)


class LinkPeers:
    """The policy's view of other nodes (engine.policy.Peers); nobody before the join."""

    def __init__(self) -> None:
        self.liveness: Liveness | None = None

    def live(self) -> bool:
        return self.liveness is not None and self.liveness.live()

    def progress_age(self, now: float) -> float | None:
        return None if self.liveness is None else self.liveness.progress_age(now)

    def collective_bounds(self) -> hang.Bounds:
        return {} if self.liveness is None else self.liveness.collective_bounds()


class NodeLink:
    def __init__(self, supervisor: Supervisor, membership: Membership, config: ClusterConfig,
                 store: ControlStore, peers: LinkPeers) -> None:
        self.sup = supervisor
        self.me = membership.node_rank
        self.nnodes = membership.nnodes
        self.nproc = {n.node_rank: n.nproc for n in membership.nodes}
        self.config = config
        self.store = store
        self.host = socket.gethostname()
        self.interval = min(0.5, max(0.05, config.node_timeout / 10))
        self.liveness = Liveness([n for n in range(self.nnodes) if n != self.me],
                                 config.node_timeout, time.monotonic())
        peers.liveness = self.liveness
        self.finals: dict[int, dict[str, Any]] = {}
        self.store_lost: str | None = None
        self.agreed_stop: dict[str, Any] | None = None
        self.verdict_ready = asyncio.Event()
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seq = 0
        self._phase = NodeState.RUNNING
        self._kill_seen = False
        self._failure_told = False
        self._beat_handle: asyncio.TimerHandle | None = None
        self._finals_read: set[int] = set()  # ticker thread only
        self._beating: set[int] = set()  # nodes whose heartbeat key exists (ticker thread)
        self.failure_seen: float | None = None  # when this node first knew of a failure stop

    # ------------------------------------------------------------------ lifetime

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        inbox = self.store.client(self._store_host, self.config.store_port, INBOX_WAIT)
        self.sup.subscribe(self.on_event)
        for name, target, args in (("inbox", self._inbox_thread, (inbox,)),
                                   ("ticker", self._ticker_thread, ())):
            thread = threading.Thread(target=target, args=args, name=f"forgelm-tui-{name}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        self._beat()

    def close(self) -> None:
        """Stop both threads (the inbox one is woken by a message to itself)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._beat_handle is not None:
            self._beat_handle.cancel()
        self._commands.put(("quit", None))
        for thread in self._threads:
            thread.join(timeout=INBOX_WAIT + 1.0)

    # ------------------------------------------------------------------ loop side: out

    def on_event(self, event: ev.Event) -> None:
        stop = self.sup.stop
        if isinstance(event, ev.RunStopping) and stop is not None and stop.origin_node == self.me:
            if stop.kind is StopKind.FAILURE and self.failure_seen is None:
                self.failure_seen = time.monotonic()
            self._commands.put(("stop", stop_to_wire(stop)))
        elif isinstance(event, ev.RankExited) and not self._failure_told:
            record = self.sup.records.get(event.rank)
            if record is not None and record.ending().failed_on_own:
                self._failure_told = True  # the first one here; the store keeps the first of all
                # after this pass of events: the stop record it causes goes out first
                self.loop.call_soon(self._commands.put,
                                    ("first-failure", {"rank": event.rank, "node": self.me}))
        elif isinstance(event, ev.RunEscalated) and not self._kill_seen:
            self._kill_seen = True
            self._commands.put(("kill", {"reason": event.reason, "node": self.me}))

    def publish_final(self, final: dict[str, Any]) -> None:
        self._phase = NodeState.DONE
        self._commands.put(("final", final))
        self._beat(reschedule=False)

    def _beat(self, reschedule: bool = True) -> None:
        records = list(self.sup.records.values())
        live = [r for r in records if r.alive]
        now = time.monotonic()
        ages = [r.progress_age(now) for r in live]
        view = ev.NodeChanged(self.me, self.host, self._phase,
                              tuple(r.snapshot() for r in records), time.time())
        self._seq += 1
        self._commands.put(("beat", {"seq": self._seq, "phase": self._phase.value,
                                     "host": self.host, "live": len(live),
                                     "progress_age": min(ages) if ages else None,
                                     "collectives": hang.to_wire(hang.bounds(live)),
                                     "view": to_wire(view)}))
        if reschedule and not self._closed.is_set():
            self._beat_handle = self.loop.call_later(self.interval, self._beat)

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
            self.verdict_ready.set()

    def _remote_stop(self, data: dict[str, Any]) -> None:
        self.agreed_stop = self.agreed_stop or data
        if data.get("kind") == StopKind.FAILURE.value and self.failure_seen is None:
            self.failure_seen = time.monotonic()
        if self.sup.stop is None:
            stop = stop_from_wire(data)
            stop.reason = f"{stop.reason} (on node {stop.origin_node})"
            self.sup.apply_stop(stop)

    def _remote_kill(self, data: dict[str, Any]) -> None:
        if not self._kill_seen:
            self._kill_seen = True
            self.sup.apply_kill(f"{data['reason']} (on node {data['node']})")

    def _on_poll(self, beats: dict[int, dict[str, Any]], finals: dict[int, dict[str, Any]],
                 stop: dict[str, Any] | None, kill: dict[str, Any] | None) -> None:
        now = time.monotonic()
        for node, beat in beats.items():
            if self.liveness.beat(node, beat, now):
                self._show(node, beat.get("view"))
        for node, final in finals.items():
            self.finals[node] = final
            self.liveness.done(node)
            self._show(node, final.get("view"), NodeState.DONE)
        if stop is not None:
            self._remote_stop(stop)
        if kill is not None:
            self._remote_kill(kill)
        lost = self.liveness.check(now)
        for node in lost:
            self._node_lost(node, f"node {node} lost: no heartbeat for "
                                  f"{self.config.node_timeout:g} s")
        if finals or lost:
            self.sup.peers_changed()

    def _show(self, node: int, view: Any, state: NodeState | None = None) -> None:
        peer = self.liveness.peers[node]
        ranks: tuple[ev.RankSnapshot, ...] = ()
        if isinstance(view, dict):
            with contextlib.suppress(DecodeError):
                decoded = from_wire(view)
                if isinstance(decoded, ev.NodeChanged):
                    ranks = decoded.ranks
        self.sup.emit(ev.NodeChanged(node, peer.host, state or peer.state, ranks, time.time()))

    def _node_lost(self, node: int, reason: str) -> None:
        self._show(node, None, NodeState.LOST)
        if self.sup.stop is None:
            self.sup.apply_stop(StopRecord(StopKind.NODE_LOST, reason, f"node {node}", None,
                                           time.time(), 0.0, grace=self.sup.spec.grace,
                                           origin_node=self.me, lost_node=node))

    def lost_before_failure(self) -> tuple[int, tuple[int, ...]] | None:
        """The node whose loss the first failure stop is collateral of (a peer's "Connection
        closed by peer"), and its ranks; None when no failure, or no node went silent before
        it (Liveness.silent_before; SPEC §10)."""
        if self.failure_seen is None:
            return None
        node = self.liveness.silent_before(self.failure_seen, 2 * self.interval)
        if node is None:
            return None
        first = sum(self.nproc.get(n, 0) for n in range(node))
        return node, tuple(range(first, first + self.nproc.get(node, 0)))

    def _store_gone(self, message: str) -> None:
        """The control store is unreachable: node 0 is gone (or the network to it)."""
        if self.store_lost is not None or self._closed.is_set():
            return
        self.store_lost = message
        for node in self.liveness.lose_all():
            if node == 0:
                self._node_lost(0, f"node 0 lost: the control store is unreachable ({message})")
            else:
                self._show(node, None, NodeState.LOST)
        self.verdict_ready.set()
        self.sup.peers_changed()

    # ------------------------------------------------------------------ threads

    def _inbox_thread(self, inbox: ControlStore) -> None:
        while not self._closed.is_set():
            try:
                message = inbox.pop(f"inbox/{self.me}", INBOX_WAIT)
            except (StoreLost, StoreTimeout) as exc:
                self._post(self._store_gone, str(exc))
                return
            if message is None or message.get("kind") == "quit":
                continue
            if message.get("kind") == "final":
                self._commands.put(("poll", None))  # the ticker reads it at once
            else:
                self._post(self._on_message, message)

    def _ticker_thread(self) -> None:
        """Publish and poll. A store that answers late (node 0 starved of CPU) is not node 0
        gone: a call that times out is retried on a fresh connection (a late answer would be
        read as the next call's) until the node timeout passes with none answered; a refused
        or reset connection is node 0 gone at once."""
        answered = time.monotonic()
        while True:
            kind, payload = self._commands.get()
            try:
                if kind == "quit":
                    with contextlib.suppress(StoreLost, StoreTimeout):
                        self.store.push(f"inbox/{self.me}", {"kind": "quit"})
                    return
                self._publish(kind, payload)
                if kind in ("beat", "poll"):
                    self._poll()
                answered = time.monotonic()
            except StoreLost as exc:
                return self._post(self._store_gone, str(exc))
            except StoreTimeout as exc:
                if time.monotonic() - answered >= self.config.node_timeout:
                    return self._post(self._store_gone, str(exc))
                if kind not in ("beat", "poll"):
                    self._commands.put((kind, payload))  # a stop, a kill, the final: again
                self._reconnect()

    def _reconnect(self) -> None:
        with contextlib.suppress(StoreLost, StoreTimeout):
            self.store = self.store.client(self._store_host, self.config.store_port, TICK_WAIT)

    @property
    def _store_host(self) -> str:
        """Where this node reaches the control store (node 0 hosts it)."""
        return "127.0.0.1" if self.me == 0 else self.config.store_host

    def _publish(self, kind: str, payload: Any) -> None:
        store = self.store
        if kind == "beat":
            store.set(f"beat/{self.me}", payload)
        elif kind == "final":
            store.set(f"final/{self.me}", payload)
            for node in range(self.nnodes):  # read now, not at the next heartbeat
                if node != self.me:
                    store.push(f"inbox/{node}", {"kind": "final", "node": self.me})
        elif kind == "first-failure":
            store.first(kind, payload)
        elif kind in ("stop", "kill") and store.first(kind, payload) == payload:
            for node in range(self.nnodes):  # the first writer tells everyone now
                if node != self.me:
                    store.push(f"inbox/{node}", {"kind": kind, kind: payload})

    def _poll(self) -> None:
        store = self.store
        peers = [n for n in range(self.nnodes) if n != self.me]
        for node in peers:  # a node's first beat may come after this node's first poll
            if node not in self._beating and store.has([f"beat/{node}"]):
                self._beating.add(node)
        beating = sorted(self._beating)
        beats = dict(zip(beating, store.many([f"beat/{n}" for n in beating]),
                         strict=True)) if beating else {}
        finals = {n: store.get(f"final/{n}") for n in peers
                  if n not in self._finals_read and store.has([f"final/{n}"])}
        self._finals_read.update(finals)
        stop = store.get("stop") if store.has(["stop"]) else None
        kill = store.get("kill") if store.has(["kill"]) else None
        self._post(self._on_poll, beats, finals, stop, kill)
