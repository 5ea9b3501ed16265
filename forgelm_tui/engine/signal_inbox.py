"""Who sent a signal to the supervisor: ``si_pid``, ``si_uid``, ``si_code`` (SPEC §10).

Python's signal handlers get only the number. To know the sender, the signals the supervisor
handles are blocked in every thread and taken by one thread with ``sigwaitinfo``, which returns
the sender. A signal with a route (:func:`route`: a callback on an event loop) goes there with
its sender, ``call_soon_threadsafe``. Any other is given back to the process the ordinary way:
the thread unblocks it for itself alone, sends it to itself (``pthread_kill``) and blocks it
again, so its handler, default or ignore disposition acts exactly as without the inbox (a
SIG_DFL SIGTERM after the run still ends the process).

Blocking must cover every thread, so the inbox starts only while the process has one thread
(the CLI, right after the guardian's fork); elsewhere (in-process tests) it stays off and
senders are unknown. Ranks must not inherit the block: a rank with SIGTERM blocked would never
die of it. :func:`children_unblocked` lifts it around each spawn (the child gets the calling
thread's mask); a signal arriving in that window is delivered the ordinary way, so a routed
signal needs its ordinary handler too (engine/own_signals.py installs both), sender unknown.

A signal that comes before its first route (the CLI blocks the usual ones at its very start,
:func:`hold_early`, while it plans and before the run installs its handlers) waits for that
route; one that comes after its route was removed (the run is over) goes the ordinary way.

SIGCONT is never taken here: slurmstepd's SIGTERM, SIGCONT, SIGTERM burst is two SIGTERMs (or
one: the kernel merges a signal still pending with its repeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

SI_USER, SI_KERNEL, SI_QUEUE, SI_TKILL = 0, 0x80, -1, -6
_CODE_NAMES = {SI_USER: "SI_USER", SI_KERNEL: "SI_KERNEL", SI_QUEUE: "SI_QUEUE",
               SI_TKILL: "SI_TKILL"}
SCHEDULER_PROCESSES = frozenset({"slurmstepd"})  # /proc/<pid>/comm of a scheduler's own process


class SenderKind:
    """Who a sender is, as far as a repeat of its request goes (engine/policy.py)."""

    SCHEDULER = "scheduler"  # slurmstepd: its repeats are one request, whenever they come
    OUTSIDE = "outside"  # si_pid 0: sent from outside this PID namespace (a container runtime)
    TERMINAL = "terminal"  # the kernel: a key at the terminal (Ctrl+C), a hang-up
    PROCESS = "process"  # any other process: a person's kill, a script


@dataclass(frozen=True)
class Sender:
    pid: int
    uid: int
    code: int
    process: str | None  # its /proc comm when it could be read at receipt
    kind: str

    @property
    def key(self) -> tuple[str, int]:
        """One sender: the same process (pid 0, outside the namespace, counts as one)."""
        return (self.kind, self.pid)

    @property
    def never_escalates(self) -> bool:
        return self.kind in (SenderKind.SCHEDULER, SenderKind.OUTSIDE)

    def as_dict(self) -> dict[str, object]:
        return {"pid": self.pid, "uid": self.uid, "code": _CODE_NAMES.get(self.code, self.code),
                "process": self.process, "kind": self.kind}


def classify(pid: int, uid: int, code: int, process: str | None, parent: int,
             under_scheduler: bool) -> Sender:
    """The sender of one signal. ``parent``: this process's parent pid; ``under_scheduler``:
    SLURM started it (its parent is then slurmstepd, whose name may be gone by the time it is
    read)."""
    if code == SI_KERNEL:
        kind = SenderKind.TERMINAL
    elif pid == 0:
        kind = SenderKind.OUTSIDE
    elif process in SCHEDULER_PROCESSES or (pid == parent and under_scheduler):
        kind = SenderKind.SCHEDULER
    else:
        kind = SenderKind.PROCESS
    return Sender(pid, uid, code, process, kind)


def _comm(pid: int) -> str | None:
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


Route = tuple[asyncio.AbstractEventLoop, Callable[[Sender], None]]


class _Inbox:
    def __init__(self) -> None:
        self.signals: frozenset[int] = frozenset()
        self.early: frozenset[int] = frozenset()  # blocked at the CLI's start (hold_early)
        self.routes: dict[int, Route] = {}
        self.waiting: dict[int, list[Sender]] = {}  # came before their first route
        self.routed: set[int] = set()  # had a route once: after it, the ordinary way
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def hold_early(self, signals: Iterable[int]) -> None:
        if self.thread is None and threading.active_count() == 1:
            self.early = frozenset(signals)
            signal.pthread_sigmask(signal.SIG_BLOCK, self.early)

    def start(self, signals: Iterable[int]) -> bool:
        if self.thread is not None:
            return True
        if threading.active_count() > 1 or not hasattr(signal, "sigwaitinfo"):
            return False  # a thread that does not block them would take some: senders unknown
        self.signals = frozenset(signals) | self.early
        signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        self.thread = threading.Thread(target=self._take, name="forgelm-tui-signals",
                                       daemon=True)
        self.thread.start()
        return True

    def _take(self) -> None:
        under_scheduler = "SLURM_JOB_ID" in os.environ
        me = threading.get_ident()
        while True:
            info = signal.sigwaitinfo(self.signals)
            sender = classify(info.si_pid, info.si_uid, info.si_code, _comm(info.si_pid),
                              os.getppid(), under_scheduler)
            with self.lock:
                route = self.routes.get(info.si_signo)
                if route is None and info.si_signo not in self.routed:  # its handler comes
                    self.waiting.setdefault(info.si_signo, []).append(sender)
                    continue
            if route is not None:
                loop, callback = route
                with contextlib.suppress(RuntimeError):  # the loop closed: the ordinary way
                    loop.call_soon_threadsafe(callback, sender)
                    continue
            # The ordinary delivery, to this thread alone: the handler (or default) runs now.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {info.si_signo})
            try:
                signal.pthread_kill(me, info.si_signo)
            finally:
                signal.pthread_sigmask(signal.SIG_BLOCK, {info.si_signo})

    def route(self, sig: int, loop: asyncio.AbstractEventLoop,
              callback: Callable[[Sender], None] | None) -> bool:
        if sig not in self.signals:
            return False
        with self.lock:
            if callback is None:
                self.routes.pop(sig, None)
                return True
            self.routes[sig] = (loop, callback)
            self.routed.add(sig)
            for sender in self.waiting.pop(sig, []):  # what came while the run was starting
                loop.call_soon_threadsafe(callback, sender)
        return True

    @contextlib.contextmanager
    def children_unblocked(self) -> Iterator[None]:
        if not self.signals:
            yield
            return
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)


_INBOX = _Inbox()


def hold_early(signals: Iterable[int]) -> None:
    """At the CLI's start, with no other thread yet: block ``signals`` until the inbox takes
    them (:func:`start` adds them to its own), so that one arriving while the run is planned,
    or nodes join, waits for its handler instead of its default action (a SIGUSR1 from
    ``sbatch --signal`` used to end the supervisor). Nothing happens with threads running."""
    _INBOX.hold_early(signals)


def start(signals: Iterable[int]) -> bool:
    """Take ``signals`` with their senders from now on. Call with no other thread running;
    False (and nothing changed) otherwise."""
    return _INBOX.start(signals)


def route(sig: int, loop: asyncio.AbstractEventLoop,
          callback: Callable[[Sender], None] | None) -> bool:
    """``sig`` goes to ``callback`` on ``loop`` with its sender (None: no more). False when the
    inbox does not take ``sig`` (not started): the caller's ordinary handler is all there is."""
    return _INBOX.route(sig, loop, callback)


def children_unblocked() -> contextlib.AbstractContextManager[None]:
    """Around a spawn: the child starts with no signal of the inbox blocked."""
    return _INBOX.children_unblocked()
