"""Restarts (``--max-restarts``), the session's side: what an attempt leaves in the envelope,
and the wait between two attempts that a cancel ends at once.

One Supervisor per attempt; the Session chains them (docs/architecture.md, "Restarts"). The
policy that decides whether an ending is restarted is pure: engine/restart_policy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import Purpose
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.policy import Peers
from forgelm_tui.engine.records import CancelRequest, CancelSource
from forgelm_tui.engine.restart_policy import AttemptFacts
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.private_files import make_private_dir
from forgelm_tui.verdict import Verdict


def attempt_facts(sup: Supervisor, verdict: Verdict) -> AttemptFacts:
    stop = sup.stop
    return AttemptFacts(
        code=verdict.code, rule=verdict.rule, stop_kind=stop.kind if stop else None,
        reason=stop.reason if stop else verdict.rule_text, cancelled=bool(sup.cancels),
        supervisor_error=sup.faults.error is not None,
        launch_error=sup.launch_error is not None)


class Backoff:
    """The wait before the next attempt; ``cancel`` ends it at once (and the run with it)."""

    def __init__(self) -> None:
        self.cancel_request: CancelRequest | None = None
        self._wake: asyncio.Future[bool] | None = None

    async def wait(self, delay: float) -> bool:
        """True when the wait ran out, False when it was cancelled."""
        if self.cancel_request is not None:
            return False
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        timer = loop.call_later(delay, self._wake_with, True)
        try:
            return bool(await wake)
        finally:
            timer.cancel()

    def cancel(self, request: CancelRequest) -> None:
        if self.cancel_request is None:
            self.cancel_request = request
        self._wake_with(False)

    def _wake_with(self, waited: bool) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(waited)


class AttemptChain:
    """The supervisors of a run's attempts, one at a time, each with every listener the views
    subscribed (in order); the wait between two attempts; the attempt under way."""

    def __init__(self, first: Supervisor, guardian: Guardian | None,
                 peers: Peers | None = None) -> None:
        self.supervisor = first
        self._peers = peers  # the other nodes, as every attempt's policy sees them
        self.attempt: ev.AttemptStarted | None = None  # None without --max-restarts
        self.backoff: Backoff | None = None  # while waiting for the next attempt
        self._guardian = guardian
        self._listeners: list[Callable[[ev.Event], None]] = []

    def subscribe(self, listener: Callable[[ev.Event], None]) -> None:
        self._listeners.append(listener)
        self.supervisor.subscribe(listener)

    def announce(self, attempt: int, max_restarts: int, why: str, delay: float,
                 nnodes: int = 1) -> None:
        self.attempt = ev.AttemptStarted(attempt, max_restarts, why, delay, time.time(), nnodes)
        self.supervisor.emit(self.attempt)  # the emit that survives a failing view

    async def supervise(self) -> None:
        """One attempt; an exception out of the engine still ends it with every rank stopped."""
        sup = self.supervisor
        try:
            await sup.run()
        except Exception as exc:
            sup.faults.caught(exc, "the supervisor's run")
            await asyncio.sleep(0)  # the fault settles: a stop if ranks still ran
            with contextlib.suppress(Exception):
                sup.signal_ranks([r for r in sup.records.values() if r.alive], signal.SIGKILL,
                                 Purpose.KILL, f"forgelm-tui itself failed ({exc!r})")

    async def wait(self, delay: float) -> CancelRequest | None:
        """The backoff; the cancel that ended it early, if one did."""
        async with self.between() as backoff:
            waited = await backoff.wait(delay)
        return None if waited else backoff.cancel_request

    @contextlib.asynccontextmanager
    async def between(self) -> AsyncIterator[Backoff]:
        """Between two attempts (the backoff; on several nodes, the join of the next one too):
        a cancel or a signal ends the run instead of reaching a supervisor."""
        self.backoff = backoff = Backoff()
        try:
            yield backoff
        finally:
            self.backoff = None

    def next(self, spec: LaunchSpec) -> Supervisor:
        """The next attempt's supervisor: the same listeners, the same hooks."""
        self.supervisor = Supervisor(spec, guardian=self._guardian, peers=self._peers,
                                     hooks=self.supervisor.hooks)
        for listener in self._listeners:
            self.supervisor.subscribe(listener)
        return self.supervisor


def remote_cancel(abort: dict[str, Any]) -> CancelRequest:
    """Another node's cancel during the backoff (its abort record), as this node's."""
    return CancelRequest(CancelSource.NODE, str(abort.get("message", "another node")),
                         signal.SIGTERM, time.time(), "stop")


def make_attempt_dir(path: Path) -> str | None:
    """The directory of a restart's files; why it could not be made, if it could not."""
    try:
        make_private_dir(path)  # 0700 whatever the umask, as the run dir (docs/security.md)
    except OSError as exc:
        return f"cannot create {path} ({exc.strerror or exc})"
    return None
