"""Who sent a signal to the supervisor: ``si_pid``, ``si_uid``, ``si_code`` (SPEC §10).

Python's signal handlers get only the number. To know the sender, the signals the supervisor
handles are blocked in every thread and read, with their sender, from a ``signalfd`` by one
thread. A signal with a route (:func:`route`: a callback on an event loop) goes there with its
sender, ``call_soon_threadsafe``. Any other is given back to the process the ordinary way:
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

Nothing received is left unread (:func:`unread`): the thread waits for the descriptor to be
readable, which takes nothing, and reads it under the inbox's lock, posting what it read before
it lets go; so a signal sent before a call of :func:`unread` on the loop's thread is, at that
call, either still in the descriptor (the call reads and posts it) or posted and not run yet
(counted). ``sigwaitinfo`` could not tell: the signal it took is in no one's hands until its
thread gets the GIL back (a node's ranks ended and its outcome went out while its own SIGTERM,
sent before, waited there: issue 23, the stop alarm).

SIGCONT is never taken here: slurmstepd's SIGTERM, SIGCONT, SIGTERM burst is two SIGTERMs (or
one: the kernel merges a signal still pending with its repeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import select
import signal
import struct
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

_SFD_NONBLOCK, _SFD_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC  # signalfd(2): the same values
_SIGINFO = 128  # sizeof(struct signalfd_siginfo)
_HEAD = struct.Struct("=IiiII")  # ssi_signo, ssi_errno, ssi_code, ssi_pid, ssi_uid


def _signalfd(signals: Iterable[int]) -> int | None:
    """A non-blocking signalfd for ``signals`` (blocked already); None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.create_string_buffer(128)  # sigset_t: 1024 bits
        libc.sigemptyset(mask)
        for sig in signals:
            libc.sigaddset(mask, sig)
        fd = int(libc.signalfd(-1, mask, _SFD_NONBLOCK | _SFD_CLOEXEC))
    except (OSError, AttributeError):
        return None
    return fd if fd >= 0 else None


def _read_all(fd: int) -> list[tuple[int, int, int, int]]:
    """Every signal waiting in the signalfd now: (signo, code, pid, uid) each."""
    got: list[tuple[int, int, int, int]] = []
    while True:
        try:
            data = os.read(fd, _SIGINFO * 16)
        except BlockingIOError:
            return got
        for at in range(0, len(data) - _SIGINFO + 1, _SIGINFO):
            signo, _errno, code, pid, uid = _HEAD.unpack_from(data, at)
            got.append((signo, code, pid, uid))


def _deliver(signo: int) -> None:
    """The ordinary delivery, to the calling thread alone: its handler (or default) now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signo})
    try:
        signal.pthread_kill(threading.get_ident(), signo)
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signo})


class _Inbox:
    def __init__(self) -> None:
        self.signals: frozenset[int] = frozenset()
        self.early: frozenset[int] = frozenset()  # blocked at the CLI's start (hold_early)
        self.routes: dict[int, Route] = {}
        self.waiting: dict[int, list[Sender]] = {}  # came before their first route
        self.routed: set[int] = set()  # had a route once: after it, the ordinary way
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.fd: int | None = None
        self.posted = 0  # routed callbacks posted, not run yet
        self.under_scheduler = False

    def hold_early(self, signals: Iterable[int]) -> None:
        if self.thread is None and threading.active_count() == 1:
            self.early = frozenset(signals)
            signal.pthread_sigmask(signal.SIG_BLOCK, self.early)

    def start(self, signals: Iterable[int]) -> bool:
        if self.thread is not None:
            return True
        if threading.active_count() > 1:
            return False  # a thread that does not block them would take some: senders unknown
        wanted = frozenset(signals) | self.early
        signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
        self.fd = _signalfd(wanted)
        if self.fd is None:  # no signalfd: the ordinary way (what came early is delivered)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)
            self.early = frozenset()
            return False
        self.signals = wanted
        self.under_scheduler = "SLURM_JOB_ID" in os.environ
        self.thread = threading.Thread(target=self._take, name="forgelm-tui-signals",
                                       daemon=True)
        self.thread.start()
        return True

    def _take(self) -> None:
        assert self.fd is not None
        while True:
            select.select([self.fd], [], [])  # readable: nothing is taken yet
            self._read()

    def _read(self) -> int:
        """Every signal in the descriptor to its route (read and posted under the lock, so
        :meth:`unread` sees each one in one place or the other), the rest delivered the
        ordinary way; how many routed callbacks wait to run."""
        assert self.fd is not None
        with self.lock:
            ordinary = [s for s in _read_all(self.fd) if not self._post(*s)]
            posted = self.posted
        for signo, *_ in ordinary:
            _deliver(signo)
        return posted

    def _post(self, signo: int, code: int, pid: int, uid: int) -> bool:
        """With the lock: one signal read to its route (or its wait for one); False: it goes
        the ordinary way (its route was removed: the run is over)."""
        sender = classify(pid, uid, code, _comm(pid), os.getppid(), self.under_scheduler)
        route = self.routes.get(signo)
        if route is None:
            if signo in self.routed:
                return False
            self.waiting.setdefault(signo, []).append(sender)  # its handler comes
            return True
        loop, callback = route
        try:
            loop.call_soon_threadsafe(self._run, callback, sender)
        except RuntimeError:  # the loop closed
            return False
        self.posted += 1
        return True

    def _run(self, callback: Callable[[Sender], None], sender: Sender) -> None:
        with self.lock:
            self.posted = max(0, self.posted - 1)
        callback(sender)

    def unread(self) -> bool:
        """On a route's loop: True while a signal received before this call has not been
        handed to its callback yet (what is still in the descriptor is posted now)."""
        return self.fd is not None and self._read() > 0

    def route(self, sig: int, loop: asyncio.AbstractEventLoop,
              callback: Callable[[Sender], None] | None) -> bool:
        if sig not in self.signals:
            return False
        with self.lock:
            if callback is None:
                self.routes.pop(sig, None)
                if not self.routes:  # the run is over: what its loop never ran is not waited for
                    self.posted = 0
                return True
            self.routes[sig] = (loop, callback)
            self.routed.add(sig)
            for sender in self.waiting.pop(sig, []):  # what came while the run was starting
                loop.call_soon_threadsafe(self._run, callback, sender)
                self.posted += 1
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


def unread() -> bool:
    """On the run's loop: True while a signal the supervisor received before this call waits
    for its route's callback (posted now if it was still unread): run what the loop has ready,
    then ask again. Always False without the inbox. A signal delivered the ordinary way while a
    rank is spawned (:func:`children_unblocked`) is not seen here."""
    return _INBOX.unread()


def children_unblocked() -> contextlib.AbstractContextManager[None]:
    """Around a spawn: the child starts with no signal of the inbox blocked."""
    return _INBOX.children_unblocked()
