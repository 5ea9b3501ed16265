"""Who is in the run: node 0 hosts the control store, every node registers, ranks start when
all have joined (SPEC §8). Runs in a worker thread; blocking calls are bounded by the join
deadline and checked against a cancel flag, so Ctrl+C during a join is never ignored.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from forgelm_tui.cluster.config import ClusterConfig as ClusterConfig  # re-exported
from forgelm_tui.cluster.rounds import close_round, late_line
from forgelm_tui.cluster.store import (
    ControlStore,
    PortTaken,
    StoreLost,
    StoreTimeout,
    torch_distributed,
)

POLL = 0.05
CONNECT_TRY = 2.0  # one connection attempt; repeated until the join deadline
SPARES = 3  # connections made while joining: the link's inbox, ticker and alarm (link.py)
# One call once connected (ClusterConfig.call_wait, 10 s; --rdzv-conf read_timeout): a node 0
# starved of CPU answers late, not never.
MEMBERS_WAIT = 0.25  # one wait for the members; abort, cancel and the deadline between waits
LINGER = 3.0  # node 0, refusing: how long it waits for the others to read why
REFUSE_WAIT = 2.0  # a refusal's write, whatever the join timeout left (the others wait on it)


@dataclass(frozen=True)
class NodeInfo:
    node_rank: int
    host: str
    pid: int
    nproc: int
    version: str
    # Tells two registrations apart when host name and pid are alike (containers on the host
    # network, each in its own PID namespace).
    token: str = ""


@dataclass(frozen=True)
class Membership:
    """The outcome of a join: the run every node agreed on."""

    run_id: str
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    nodes: tuple[NodeInfo, ...]
    hosting: bool  # this node hosts the control store (node 0)
    node_id: int = 0  # its name for the whole run: its run dir's node-<id>
    attempt: int = 0  # the attempt (round) it joined: 0 but for a late node (cluster/rejoin.py)
    restarts_used: int = 0  # that attempt's restarts counted against --max-restarts


class JoinRefused(Exception):
    """The run cannot start; the message names why (published so every node says the same).
    ``stop``: a node was cancelled while joining; its stop record, for every node to apply."""

    def __init__(self, message: str, stop: dict[str, Any] | None = None,
                 cancel: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.stop = stop
        self.cancel = cancel  # a cancel during a restart's backoff (cluster/rejoin.py)


class JoinCancelled(Exception):
    """This node was asked to stop while joining."""


class LateForRound(Exception):
    """Elastic: this node came after round ``attempt`` closed (cluster/rejoin.py waits for the
    next one)."""

    def __init__(self, run_id: str, attempt: int, message: str) -> None:
        super().__init__(message)
        self.run_id, self.attempt = run_id, attempt


class Joiner:
    def __init__(self, config: ClusterConfig, cancelled: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic,
                 notice: Callable[[str], None] = lambda text: None) -> None:
        self.config = config
        self.notice = notice  # one line for the views (any thread)
        self.unresolved = False  # node 0's name did not resolve (yet)
        self.cancelled = cancelled
        self.clock = clock
        self.deadline = clock() + config.join_timeout
        self.store: ControlStore | None = None  # node 0's is the server as well
        self.hosting = False
        self.registered = False  # this node's node/<rank> key is its own
        self.registered_as = -1
        # The control plane's other connections, made while joining: the store's server
        # looks each new client's address up in DNS on its one thread (torch's TCPStore; a
        # resolver that does not answer holds every call of every node for its 5 s timeout:
        # docs/multinode.md), so none is made once the ranks run, where a stop must be fast.
        self.spares: list[ControlStore] = []
        self.node_id = 0
        self.round = 0  # the attempt this node joins (elastic: the round under way)

    def join(self) -> Membership:
        """This node's membership, or JoinRefused with why (every registered node gets the
        same reason: a node that loses the store once registered says so, if it can, rather
        than leave the others waiting for their join timeout)."""
        try:
            return self._join()
        except (StoreLost, StoreTimeout) as exc:
            if self.store is None or not self.registered:
                raise
            self._refuse(self.store, f"node {self.registered_as} could not finish joining: "
                         f"control store: {exc}")
            raise  # not reached: _refuse raises

    def _join(self) -> Membership:
        cfg = self.config
        torch_distributed()  # importing torch (seconds) overlaps node 0's start
        store = self._open()
        store.set_timeout(min(self.config.call_wait, self._left()))
        run = self._run_record(store)
        store.scoped(run["run_id"])
        self.round = 0
        if cfg.elastic and not self.hosting:  # a name for the run, then the round under way
            self.node_id = store.add("node-ids", 1)
            self.round = store.get("round") if store.has(["round"]) else 0
            if self.round:
                store.scoped(f"{run['run_id']}/attempt-{self.round}")
        node_rank = cfg.node_rank
        if node_rank is None or cfg.elastic:  # the order of joining (elastic: each round's)
            node_rank = 0 if self.hosting else store.add("join-order", 1)
        if not 0 <= node_rank < cfg.nnodes or (cfg.elastic and store.has(["members"])):
            if cfg.elastic:  # the run goes on without it: it waits for the next round
                raise LateForRound(run["run_id"], self.round, late_line(cfg))
            self._refuse(store, f"node rank {node_rank} is outside --nnodes {cfg.nnodes} "
                         "(more nodes joined than the run has)")
        if run["version"] != cfg.version:  # before registering: node 0 never starts its ranks
            self._refuse(store, f"node {node_rank} runs forgelm-tui {cfg.version}, node 0 runs "
                         f"{run['version']}: every node must run the same version")
        self._register(store, node_rank, "joined")
        nodes = self._wait_for_all(store, node_rank, run["run_id"])
        if not cfg.elastic:
            self.node_id = node_rank  # its name for the whole run (the run dir's node-<id>)
        if self.round:  # an elastic round that began after the first: its port
            run = {**run, **store.get("run")}
        return Membership(run["run_id"], node_rank, len(nodes), run["master_addr"],
                          run["master_port"], nodes, self.hosting, self.node_id, self.round,
                          run.get("restarts_used", 0))

    # ------------------------------------------------------------------ steps

    def _register(self, store: ControlStore, node_rank: int, joined: str) -> None:
        """This node's record (a second one of its node rank is refused), its first heartbeat,
        and the link's other connections, made now: a DNS stall is the join's time, not a
        refusal, and none is made once the node may run."""
        cfg = self.config
        me = NodeInfo(node_rank, socket.gethostname(), os.getpid(), cfg.nproc, cfg.version,
                      os.urandom(8).hex())
        held = store.first(f"node/{node_rank}", asdict(me))
        self.registered, self.registered_as = held == asdict(me), node_rank
        if not self.registered:
            self._refuse(store, f"node rank {node_rank} {joined} twice: {held['host']} pid "
                         f"{held['pid']} and {me.host} pid {me.pid}")
        store.set(f"beat/{node_rank}", {"seq": 0, "phase": "joining"})
        self.spares = [self._client(max(CONNECT_TRY, self._left())) for _ in range(SPARES)]

    def _client(self, timeout: float) -> ControlStore:
        """Another connection to the store, under the same prefix (node 0 reaches its own at
        127.0.0.1)."""
        assert self.store is not None
        host = "127.0.0.1" if self.hosting else self.config.store_host
        return self.store.client(host, self.config.store_port, timeout)

    def _open(self) -> ControlStore:
        cfg = self.config
        hosts = cfg.is_host if cfg.is_host is not None else (
            cfg.node_rank == 0 or (cfg.node_rank is None and _is_local(cfg.store_host)))
        if hosts:
            try:
                self.store = ControlStore.host(cfg.store_port, cfg.node_timeout)
                self.hosting = True
                return self.store
            except PortTaken as exc:
                if cfg.node_rank == 0:
                    raise JoinRefused(f"{exc} (the control store listens at --rdzv-endpoint's "
                                      "port, else --master-port + 1)") from None
        while True:  # one try at least: importing torch may have used the time up
            if self.cancelled():
                raise JoinCancelled()
            listening = _listening(cfg.store_host, cfg.store_port)
            self._resolves(cfg.store_host, listening is not None)
            if listening:  # torch's client retries on its own for seconds: ask first
                with contextlib.suppress(StoreLost, StoreTimeout):
                    self.store = ControlStore.connect(cfg.store_host, cfg.store_port,
                                                      min(CONNECT_TRY, self._left()))
                    return self.store
            self._check_time(f"node 0's address {cfg.store_host} never resolved"
                             if self.unresolved else f"the control store at {cfg.store_host}:"
                             f"{cfg.store_port} never answered (is node 0 started?)")
            time.sleep(POLL)

    def _resolves(self, host: str, resolved: bool) -> None:
        """Node 0's name may not resolve yet (Kubernetes: its pod and service come up in any
        order): said once, then retried until the join timeout, never refused at once."""
        if not resolved and not self.unresolved:
            self.notice(f"node 0's address {host} does not resolve yet: retrying until the "
                        f"join timeout ({self.config.join_timeout:g} s)")
        self.unresolved = not resolved

    def _run_record(self, store: ControlStore) -> dict[str, Any]:
        cfg = self.config
        if self.hosting:
            run: dict[str, Any] = {
                   "run_id": cfg.run_id, "nnodes": cfg.nnodes, "version": cfg.version,
                   "master_addr": cfg.master_addr,
                   "master_port": cfg.master_port or _free_port(),
                   "fixed": cfg.run_id_fixed}
            store.set("run", run)
            return run
        while not store.has(["run"]):
            self._check_time("node 0 never published the run")
            time.sleep(POLL)
        run = dict(store.get("run"))
        if run["nnodes"] != cfg.nnodes:
            store.scoped(run["run_id"])
            self._refuse(store, f"--nnodes differs: node 0 has {run['nnodes']}, this node "
                         f"{cfg.nnodes}")
        if cfg.run_id_fixed and run["run_id"] != cfg.run_id:
            store.scoped(run["run_id"])
            self._refuse(store, f"run id differs: node 0 runs {run['run_id']!r}, this node "
                         f"was given {cfg.run_id!r}")
        return run

    def _wait_for_all(self, store: ControlStore, node_rank: int,
                      run_id: str) -> tuple[NodeInfo, ...]:
        """Each node counts itself in once registered; the one that completes the count writes
        the members for all, and every node waits on that one record (the store wakes them):
        the join costs O(nodes) calls, not a poll of every node's key by every node. An
        elastic round is closed by node 0 (cluster/rounds.py)."""
        nnodes, cfg = self.config.nnodes, self.config
        def check() -> None:  # while node 0 waits for the round to fill
            self._check_abort(store)
            if self.cancelled():
                raise JoinCancelled()

        if cfg.elastic and self.hosting:
            close_round(store, cfg, self.clock, self.deadline, check,
                        lambda why: self._refuse(store, why))
        elif not cfg.elastic and store.add("joined", 1) == nnodes:
            store.set("members", store.many([f"node/{n}" for n in range(nnodes)]))
        while True:
            members = store.wait_get("members", MEMBERS_WAIT)
            if members is not None and node_rank >= len(members):  # no abort: it runs
                raise LateForRound(run_id, self.round, late_line(cfg, len(members)))
            if members is not None:
                return tuple(NodeInfo(**v) for v in members)
            self._check_abort(store)
            if self.cancelled():
                raise JoinCancelled()
            if self.clock() >= self.deadline:
                store.set_timeout(max(store.timeout, REFUSE_WAIT))  # naming them, then saying it
                missing = [n for n in range(nnodes) if not store.has([f"node/{n}"])]
                self._refuse(store, f"node{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(map(str, missing))} never joined within the join "
                             f"timeout of {self.config.join_timeout:g} s")

    # ------------------------------------------------------------------ failing

    def _check_abort(self, store: ControlStore) -> None:
        """Another node published why the run (or the restart) cannot start."""
        if store.has(["abort"]):
            abort = store.get("abort")
            self._seen_abort(store)
            raise JoinRefused(abort["message"], abort.get("stop"), abort.get("cancel"))

    def _refuse(self, store: ControlStore, message: str) -> None:
        """Publish why the run cannot start (the first reason wins) and refuse with it."""
        stop = None
        try:
            store.set_timeout(max(store.timeout, REFUSE_WAIT))
            held = store.first("abort", {"message": message})
            message, stop = held["message"], held.get("stop")
            self._seen_abort(store)
        except (StoreLost, StoreTimeout):
            pass
        raise JoinRefused(message, stop)

    def abandon(self, message: str, stop: dict[str, Any]) -> None:
        """This node was cancelled while joining: every node stops the same way."""
        if self.store is not None:
            with contextlib.suppress(StoreLost, StoreTimeout):
                self.store.first("abort", {"message": message, "stop": stop})
                self._seen_abort(self.store)  # it knows why: node 0 need not wait for it

    def _seen_abort(self, store: ControlStore) -> None:
        if self.hosting:
            self._linger(store)
        elif self.registered:
            store.add("abort-seen", 1)  # node 0 keeps the store up until every node read it

    def _linger(self, store: ControlStore) -> None:
        """Node 0 hosts the store: it stays until every other registered node has read the
        abort (at most LINGER seconds), or they would only see the store vanish."""
        if not self.hosting:
            return
        others = sum(store.has([f"node/{n}"]) for n in range(1, self.config.nnodes))
        deadline = time.monotonic() + LINGER
        while store.add("abort-seen", 0) < others and time.monotonic() < deadline:
            time.sleep(POLL)

    def _check_time(self, message: str) -> None:
        if self.cancelled():
            raise JoinCancelled()
        if self.clock() >= self.deadline:
            raise JoinRefused(f"{message}: join timeout of {self.config.join_timeout:g} s")

    def _left(self) -> float:
        return max(0.1, self.deadline - self.clock())


def _is_local(host: str) -> bool:
    """The address is this machine's: binding to it works."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False
    for *_, sockaddr in infos:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((sockaddr[0], 0))
                return True
            except OSError:
                continue
    return False


def _listening(host: str, port: int) -> bool | None:
    """Something accepts connections there (a plain socket: bounded, and Ctrl+C is seen);
    None when the name does not resolve (one lookup: a slow resolver is paid once a try)."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):  # UnicodeError: never resolves (config.py)
        return None
    for family, kind, proto, _, address in addresses:
        with contextlib.suppress(OSError), socket.socket(family, kind, proto) as sock:
            sock.settimeout(0.5)
            sock.connect(address)
            return True
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port
