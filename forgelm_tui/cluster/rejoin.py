"""Joining an attempt after the first (cluster/join.py joins the first): every node joins
a restart under the attempt's own keys (``<run>/attempt-K/``: its stop, heartbeats, verdict
start empty); a cancel during the backoff on any node ends the run on every node; and in an
elastic run (``--nnodes MIN:MAX``) a node that came after the round under way closed waits for
the next one, which node 0 begins at once when the run has fewer than MAX nodes (a stop of
kind ``membership``: every node's ranks start again with it, not counted as a restart).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from forgelm_tui.cluster.join import (
    CONNECT_TRY,
    MEMBERS_WAIT,
    POLL,
    Joiner,
    LateForRound,
    Membership,
    _free_port,
)
from forgelm_tui.cluster.store import ControlStore, StoreLost, StoreTimeout


class RoundJoiner(Joiner):
    """A node's joiner for the whole run: the first attempt's join, then each restart's."""

    server: ControlStore | None = None  # node 0: the object its store's server lives in
    others: int = 0  # the other nodes of the last attempt joined

    def join(self) -> Membership:
        try:
            membership = super().join()
        except LateForRound as late:
            self.notice(str(late))
            membership = self._next_round(late.run_id, late.attempt)
        self.others = membership.nnodes - 1
        return membership

    def rejoin(self, run_id: str, node_rank: int, attempt: int,
               restarts_used: int) -> Membership:
        """Restart ``attempt`` (1, 2...): the same nodes join again under the attempt's own
        keys (``<run>/attempt-K/``: its stop, heartbeats, verdict start empty), each attempt
        on a connection of its own (a late write of the last attempt's link stays under the
        last attempt's keys). A node too late for an elastic round waits for the next one
        (the membership it returns says which attempt it joined)."""
        assert self.store is not None
        if self.hosting and self.server is None:
            self.server = self.store  # the store's server lives in this object: kept
        self.deadline = self.clock() + self.config.join_timeout
        self.store = self._client(max(CONNECT_TRY, self._left()))
        try:
            membership = self._round(run_id, node_rank, attempt, restarts_used)
        except LateForRound as late:
            self.notice(str(late))
            membership = self._next_round(run_id, late.attempt)
        self.others = membership.nnodes - 1
        return membership

    def _next_round(self, run_id: str, current: int) -> Membership:
        """Too late for round ``current``: tell node 0 (its inbox: it stops the run to re-form
        it, when it has fewer than MAX nodes), then join the next round when it opens."""
        store = self.store
        assert store is not None
        while True:
            store.scoped(run_id if current == 0 else f"{run_id}/attempt-{current}")
            store.push("inbox/0", {"kind": "waiting"})
            store.scoped(run_id)
            while store.wait_get(f"round/{current + 1}", MEMBERS_WAIT) is None:
                self._check_time(f"no new round of the run began for this node (--nnodes "
                                 f"{self.config.min_nodes}:{self.config.nnodes}: node 0 "
                                 "re-forms the run only while it has fewer than MAX nodes)")
            try:
                return self._round(run_id, -1, current + 1, 0)
            except LateForRound as late:  # others came first again
                current = late.attempt

    def _round(self, run_id: str, node_rank: int, attempt: int,
               restarts_used: int) -> Membership:
        """Join attempt ``attempt``. Node 0 picks a free master port again unless one was
        given and publishes it (a restart never meets the port the old rank 0 still holds),
        and marks the round begun at the run's level (``round``, ``round/<K>``: a node waiting
        to join an elastic run joins it). A node that never comes back, or a cancel during
        the backoff on any node (its ``abort``), refuses the restart; a cancel here is seen
        before anything is written and after the members are read."""
        cfg, store = self.config, self.store
        assert store is not None
        self._check_time("cancelled")
        self.registered = False
        store.set_timeout(min(self.config.call_wait, self._left()))
        store.scoped(f"{run_id}/attempt-{attempt}")
        if self.hosting:
            store.set("run", {"master_addr": cfg.master_addr, "restarts_used": restarts_used,
                              "master_port": cfg.master_port or _free_port()})
            store.scoped(run_id)
            store.set("round", attempt)
            store.set(f"round/{attempt}", 1)
            store.scoped(f"{run_id}/attempt-{attempt}")
        while not store.has(["run"]):
            self._check_abort(store)
            self._check_time("node 0 never published the restart")
            time.sleep(POLL)
        run = store.get("run")
        if cfg.elastic:  # each round numbers its nodes again, in the order they join it
            node_rank = 0 if self.hosting else store.add("join-order", 1)
        self._register(store, node_rank, f"joined restart {attempt}")
        self.round = attempt
        nodes = self._wait_for_all(store, node_rank, run_id)
        self._check_time("cancelled")  # a cancel as the members came: the others see abort
        return Membership(run_id, node_rank, len(nodes), run["master_addr"],
                          run["master_port"], nodes, self.hosting, self.node_id, attempt,
                          run.get("restarts_used", restarts_used))

    def abort_restart(self, run_id: str, attempt: int, message: str,
                      cancel: dict[str, Any] | None) -> dict[str, Any]:
        """A cancel during the backoff: every node's restart is refused with the first one
        (first writer wins: the record every node ends with); this one when the store is
        gone."""
        mine = {"message": message, "cancel": cancel}
        if self.store is None:
            return mine
        try:  # a connection of its own: the last attempt's link may still hold its own
            store = self._client(self.config.call_wait)
            store.scoped(f"{run_id}/attempt-{attempt}")
            held = dict(store.first("abort", mine))
            self._seen_restart_abort(store)
            return held
        except (StoreLost, StoreTimeout):
            return mine

    def _seen_restart_abort(self, store: ControlStore) -> None:
        """Node 0 hosts the store: it stays until the other nodes have read the abort (at
        most ``ack_wait``); each other node says it read it."""
        if not self.hosting:
            store.add("abort-seen", 1)
            return
        deadline = time.monotonic() + self.config.ack_wait
        while store.add("abort-seen", 0) < self.others and time.monotonic() < deadline:
            time.sleep(POLL)

    def watch_restart(self, run_id: str, attempt: int, until: Callable[[], bool],
                      ) -> dict[str, Any] | None:
        """During the backoff: another node's cancel (its abort record), if one comes before
        ``until()``; on a connection of its own (the link's are closed by now)."""
        try:
            watcher = self._client(self.config.call_wait)
            watcher.scoped(f"{run_id}/attempt-{attempt}")
            while not until():
                abort = watcher.wait_get("abort", MEMBERS_WAIT)
                if abort is not None:
                    return dict(abort)
        except (StoreLost, StoreTimeout):
            return None
        return None

