"""The join (SPEC §8), in process: several Joiners in threads, one real TCPStore on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cluster_nodes import free_port_pair
from conftest import wait_for

from forgelm_tui import __version__
from forgelm_tui.cluster.join import ClusterConfig, JoinCancelled, Joiner, JoinRefused, Membership
from forgelm_tui.cluster.store import ControlStore, StoreTimeout

pytestmark = pytest.mark.timeout(60)

WAIT = 20.0  # every wait on a joiner thread is bounded by this
TEARDOWN = 15.0  # all the joins of a test together, once cancelled


def config(port: int, nnodes: int, node_rank: int | None, **changes: Any) -> ClusterConfig:
    """Node ``node_rank``'s config; the control store at ``port`` + 1, rank 0's at ``port``."""
    base = ClusterConfig(
        nnodes=nnodes, node_rank=node_rank, store_host="127.0.0.1", store_port=port + 1,
        master_addr="127.0.0.1", master_port=port, run_id=f"run-of-{node_rank}",
        run_id_fixed=False, nproc=1, join_timeout=WAIT, node_timeout=5.0)
    return dataclasses.replace(base, **changes)


class Node:
    """One supervisor's join, in a thread of the test process."""

    def __init__(self, cfg: ClusterConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cancel = threading.Event()
        self.joiner = Joiner(cfg, self.cancel.is_set, clock)
        self.result: Membership | BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.joiner.join()
        except BaseException as exc:  # handed to the test thread
            self.result = exc

    def wait(self) -> Membership | BaseException:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the join did not end in time"
        assert self.result is not None
        return self.result

    def membership(self) -> Membership:
        result = self.wait()
        assert isinstance(result, Membership), repr(result)
        return result

    def refused(self) -> JoinRefused:
        result = self.wait()
        assert isinstance(result, JoinRefused), repr(result)
        return result


class Nodes:
    """The test's nodes; at the end every join is cancelled, awaited and its store closed."""

    def __init__(self) -> None:
        self.port = free_port_pair()
        self.started: list[Node] = []
        self.probes: list[ControlStore] = []

    def start(self, nnodes: int, node_rank: int | None, *,
              clock: Callable[[], float] = time.monotonic, **changes: Any) -> Node:
        node = Node(config(self.port, nnodes, node_rank, **changes), clock)
        self.started.append(node)
        return node

    def probe(self, run_id: str) -> ControlStore:
        """A client of the control store, scoped to ``run_id``, to watch the join."""
        store = ControlStore.connect("127.0.0.1", self.port + 1, 10.0)
        store.scoped(run_id)
        self.probes.append(store)
        return store

    def registered(self, run_id: str, *names: str) -> None:
        store = self.probe(run_id)
        wait_for(lambda: store.has(list(names)), WAIT, f"{names} in the store")

    def close(self) -> None:
        for node in self.started:
            node.cancel.set()
        deadline = time.monotonic() + TEARDOWN
        for node in self.started:
            node.thread.join(max(0.0, deadline - time.monotonic()))
        stores = [*self.probes, *(n.joiner.store for n in self.started if not n.joiner.hosting),
                  *(n.joiner.store for n in self.started if n.joiner.hosting)]
        for store in stores:  # clients first, the server last
            if store is not None:
                store.close()
        for node in self.started:
            node.joiner.store = None
        self.started.clear()
        self.probes.clear()


@pytest.fixture
def short_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0, refusing, waits for the other registered nodes to read why (join.LINGER, 3 s at
    most): a node that abandoned its join, or one that finished it first, never reads it. In
    process the store outlives node 0's join anyway, so the wait only costs time."""
    from forgelm_tui.cluster import join as join_mod

    monkeypatch.setattr(join_mod, "LINGER", 0.2)


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    group = Nodes()
    try:
        yield group
    finally:
        group.close()


def test_three_nodes_join_with_explicit_ranks(nodes: Nodes) -> None:
    started = [nodes.start(3, rank, nproc=rank + 1) for rank in (2, 0, 1)]
    members = sorted((n.membership() for n in started), key=lambda m: m.node_rank)
    assert [m.node_rank for m in members] == [0, 1, 2]
    assert {m.run_id for m in members} == {"run-of-0"}
    assert [m.hosting for m in members] == [True, False, False]
    for member in members:
        assert member.nnodes == 3
        assert (member.master_addr, member.master_port) == ("127.0.0.1", nodes.port)
        assert len(member.nodes) == 3
        assert [n.node_rank for n in member.nodes] == [0, 1, 2]
        assert [n.nproc for n in member.nodes] == [1, 2, 3]
        assert {n.version for n in member.nodes} == {__version__}
    assert members[0].nodes == members[1].nodes == members[2].nodes


def test_fixed_run_id_agreed(nodes: Nodes) -> None:
    started = [nodes.start(2, rank, run_id="job-7", run_id_fixed=True) for rank in (0, 1)]
    assert {n.membership().run_id for n in started} == {"job-7"}


def test_the_links_connections_are_made_while_joining(nodes: Nodes) -> None:
    """No connection is made once the ranks run (the store's server resolves each new client
    in DNS on its one thread: docs/multinode.md): the join hands the link its spares, under
    the run's prefix, answering."""
    from forgelm_tui.cluster.join import SPARES

    started = [nodes.start(2, rank, run_id="job-8", run_id_fixed=True) for rank in (0, 1)]
    for node in started:
        node.membership()
        assert len(node.joiner.spares) == SPARES == 3
        for spare in node.joiner.spares:
            spare.set_timeout(5.0)
            assert spare.has(["node/0", "node/1"])  # the run's keys: its prefix


def test_c10d_numbers_nodes_in_join_order(nodes: Nodes) -> None:
    first = nodes.start(3, None, run_id="run-of-first")
    wait_for(lambda: first.joiner.hosting or first.result is not None, WAIT, "a host")
    others = [nodes.start(3, None, run_id=f"run-of-other-{i}") for i in range(2)]
    host = first.membership()
    assert (host.node_rank, host.hosting) == (0, True)
    members = [o.membership() for o in others]
    assert sorted(m.node_rank for m in members) == [1, 2]
    assert not any(m.hosting for m in members)
    assert {m.run_id for m in [host, *members]} == {"run-of-first"}
    assert [n.node_rank for n in host.nodes] == [0, 1, 2]


def test_duplicate_node_rank_refuses_every_node(nodes: Nodes) -> None:
    node0 = nodes.start(3, 0)
    node1 = nodes.start(3, 1)
    nodes.registered("run-of-0", "node/0", "node/1")
    twin = nodes.start(3, 1, nproc=2)  # another supervisor (same host and pid: in process)
    refusal = twin.refused()
    assert "node rank 1 joined twice" in str(refusal)
    assert refusal.stop is None
    for other in (node0, node1):
        assert str(other.refused()) == str(refusal)


@pytest.mark.usefixtures("short_linger")
def test_duplicate_node_rank_with_identical_registration(nodes: Nodes) -> None:
    """Same host name, pid, nproc and version (containers on the host network)."""
    nodes.start(2, 0)
    nodes.start(2, 1)
    nodes.registered("run-of-0", "node/0", "node/1")
    twin = nodes.start(2, 1)
    assert "node rank 1 joined twice" in str(twin.refused())


def test_version_mismatch_refused_naming_both(nodes: Nodes) -> None:
    node0 = nodes.start(3, 0)  # node 2 never comes: node 0 can only end by the abort
    other = nodes.start(3, 1, version="0.0.1-other")
    refusal = other.refused()
    assert "0.0.1-other" in str(refusal) and __version__ in str(refusal)
    assert "same version" in str(refusal)
    assert str(node0.refused()) == str(refusal)


def test_version_mismatch_refuses_node0_when_every_node_registered(
        nodes: Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    original = ControlStore.first
    waiting: list[Node] = []

    def slow(store: ControlStore, name: str, value: Any) -> Any:
        held = original(store, name, value)
        if name.startswith("node/") and value.get("version") == "0.0.1-other":
            deadline = time.monotonic() + 10.0  # let node 0 poll the complete set first
            while waiting and waiting[0].thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
        return held

    monkeypatch.setattr(ControlStore, "first", slow)
    waiting.append(nodes.start(2, 0))
    other = nodes.start(2, 1, version="0.0.1-other")
    assert "same version" in str(other.refused())
    assert "same version" in str(waiting[0].wait())


def test_nnodes_mismatch_refused(nodes: Nodes) -> None:
    node0 = nodes.start(2, 0)
    wait_for(lambda: node0.joiner.hosting, WAIT, "node 0 to host")
    other = nodes.start(3, 1)
    refusal = other.refused()
    assert "--nnodes differs: node 0 has 2, this node 3" in str(refusal)
    assert str(node0.refused()) == str(refusal)


def test_fixed_run_id_mismatch_refused(nodes: Nodes) -> None:
    node0 = nodes.start(2, 0, run_id="job-a", run_id_fixed=True)
    other = nodes.start(2, 1, run_id="job-b", run_id_fixed=True)
    refusal = other.refused()
    assert "run id differs" in str(refusal)
    assert "'job-a'" in str(refusal) and "'job-b'" in str(refusal)
    assert str(node0.refused()) == str(refusal)


@pytest.mark.usefixtures("short_linger")  # in process the store outlives node 0's join
@pytest.mark.parametrize("timing_out", [0, 1])
def test_missing_node_named_after_join_timeout(nodes: Nodes, timing_out: int) -> None:
    start, gate = time.monotonic(), threading.Event()

    def held() -> float:  # the joiners' time stands still until both have registered
        return time.monotonic() if gate.is_set() else start

    timeouts = {timing_out: 0.2, 1 - timing_out: WAIT}
    node0 = nodes.start(3, 0, join_timeout=timeouts[0], clock=held)
    nodes.registered("run-of-0", "node/0")
    node1 = nodes.start(3, 1, join_timeout=timeouts[1], clock=held)
    nodes.registered("run-of-0", "node/1")
    gate.set()
    messages = {str(n.refused()) for n in (node0, node1)}
    assert len(messages) == 1
    message = messages.pop()
    assert "node 2 never joined" in message and "0.2 s" in message


def test_node0_never_started(nodes: Nodes) -> None:
    lonely = nodes.start(2, 1, join_timeout=0.2)
    message = str(lonely.refused())
    assert "never answered" in message and "0.2 s" in message


def test_cancel_while_waiting_for_the_others(nodes: Nodes) -> None:
    node0 = nodes.start(2, 0)
    nodes.registered("run-of-0", "node/0", "beat/0")
    node0.cancel.set()
    assert isinstance(node0.wait(), JoinCancelled)


def test_cancel_while_node0_is_missing(nodes: Nodes) -> None:
    lonely = nodes.start(2, 1)
    lonely.cancel.set()
    assert isinstance(lonely.wait(), JoinCancelled)


def test_abandoned_join_carries_the_stop_to_every_node(nodes: Nodes) -> None:
    """The node that abandons counts itself as having read why (``abort-seen``): node 0 does
    not wait out its linger for it (it did, 3 s, in every real run cancelled while joining)."""
    node0 = nodes.start(3, 0)
    node1 = nodes.start(3, 1)
    nodes.registered("run-of-0", "beat/0", "beat/1")
    node1.cancel.set()
    assert isinstance(node1.wait(), JoinCancelled)
    stop = {"kind": "cancel", "reason": "operator", "origin_node": 1}
    node1.joiner.abandon("cancelled on a node while joining (operator)", stop)
    assert node1.joiner.store is not None and node1.joiner.store.add("abort-seen", 0) == 1
    refusal = node0.refused()
    assert str(refusal) == "cancelled on a node while joining (operator)"
    assert refusal.stop == stop


def test_node0_port_taken(nodes: Nodes) -> None:
    with socket.socket() as squatter:
        squatter.bind(("", nodes.port + 1))
        squatter.listen()
        node0 = nodes.start(2, 0)
        message = str(node0.refused())
    assert "already in use" in message and str(nodes.port + 1) in message
    assert not node0.joiner.hosting


def test_client_started_before_node0_keeps_retrying(nodes: Nodes,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1 first: it probes the control port (a plain socket, bounded) until node 0 is up."""
    from forgelm_tui.cluster import join as join_mod

    attempts: list[bool] = []
    original = join_mod._listening

    def counted(host: str, port: int) -> bool:
        attempts.append(original(host, port))
        return attempts[-1]

    monkeypatch.setattr(join_mod, "_listening", counted)
    early = nodes.start(2, 1)
    wait_for(lambda: len(attempts) >= 2, WAIT, "a second connection attempt")
    assert early.result is None and not any(attempts)
    node0 = nodes.start(2, 0)
    member = early.membership()
    assert (member.node_rank, member.run_id, member.hosting) == (1, "run-of-0", False)
    assert node0.membership().node_rank == 0


def test_a_node_that_loses_the_store_after_registering_tells_the_others(
        nodes: Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1 registered, then a connection it makes while joining failed (a loaded machine:
    a CI run saw one connect time out after 2 s): it says why, and node 0, whose join timeout
    is 20 s, refuses at once with that reason instead of waiting its timeout out."""
    real = Joiner._client

    def failing(self: Joiner, timeout: float) -> ControlStore:
        if self.config.node_rank == 1:
            raise StoreTimeout("the client socket has timed out after 2000ms")
        return real(self, timeout)

    monkeypatch.setattr(Joiner, "_client", failing)
    node0 = nodes.start(2, 0)
    node1 = nodes.start(2, 1)
    messages = {str(n.refused()) for n in (node1, node0)}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message.startswith("node 1 could not finish joining: control store:"), message
