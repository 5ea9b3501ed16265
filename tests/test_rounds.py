"""An elastic run's round, in-process on a fake store and an injected clock (cluster/rounds.py):
node 0 closes it at MAX nodes at once, at MIN once the last call has passed, and refuses it
with too few nodes at the join deadline."""

from __future__ import annotations

from typing import Any

import pytest
from test_cluster_traffic import FakeStore

from forgelm_tui.cluster import rounds
from forgelm_tui.cluster.config import ClusterConfig

pytestmark = pytest.mark.timeout(10)


class Refused(Exception):
    pass


def setup(monkeypatch: pytest.MonkeyPatch, joined: int, *, arrivals: dict[float, int] | None
          = None) -> tuple[FakeStore, ClusterConfig, list[float]]:
    """A store where ``joined`` nodes besides node 0 took a number (and registered); more
    arrive at the given fake times. Each poll's sleep moves the clock on by 0.5 s."""
    store = FakeStore()
    now = [0.0]
    pending = dict(arrivals or {})

    def register(count: int) -> None:
        store.data["join-order"] = str(count)
        for node in range(count + 1):
            store.data.setdefault(f"node/{node}", f'{{"node_rank": {node}}}')

    register(joined)

    def sleep(_: float) -> None:
        now[0] += 0.5
        for at in sorted(pending):
            if at <= now[0]:
                register(pending.pop(at))

    monkeypatch.setattr(rounds.time, "sleep", sleep)
    config = ClusterConfig(3, None, "h", 1, "h", None, "r", True, 2, join_timeout=5.0,
                           last_call=2.0, min_nodes=2)
    return store, config, now


def close(store: FakeStore, config: ClusterConfig, now: list[float]) -> list[Any]:
    def refuse(why: str) -> None:
        raise Refused(why)

    return rounds.close_round(store, config, lambda: now[0], 5.0, lambda: None, refuse)


def test_max_nodes_close_the_round_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    store, config, now = setup(monkeypatch, 2)
    members = close(store, config, now)
    assert [m["node_rank"] for m in members] == [0, 1, 2] and now[0] == 0.0
    assert store.get("members") == members


def test_min_nodes_close_it_once_the_last_call_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    store, config, now = setup(monkeypatch, 1)
    members = close(store, config, now)
    assert [m["node_rank"] for m in members] == [0, 1]
    assert now[0] == 2.0  # MIN from the start, then last_call_timeout


def test_a_node_arriving_in_the_last_call_is_in_the_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store, config, now = setup(monkeypatch, 1, arrivals={1.0: 2})
    members = close(store, config, now)
    assert [m["node_rank"] for m in members] == [0, 1, 2] and now[0] == 1.0


def test_too_few_nodes_at_the_join_deadline_refuse_the_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store, config, now = setup(monkeypatch, 0)
    with pytest.raises(Refused) as refused:
        close(store, config, now)
    assert str(refused.value) == ("1 node joined within the join timeout of 5 s; --nnodes 2:3 "
                                  "needs 2")
    assert "members" not in store.data and now[0] == 5.0
