"""Every process a rank started, including those that left its process group, ends with the run.

A rank's own group gets the stop's signals (spawn.py) and a group's leftovers are SIGKILLed when
the rank ends (processes.py). A process that left the group (``start_new_session=True``,
``setsid``, a double fork: data-loader daemons, tensorboard, trackers) is found two ways:

- environment: every rank's environment carries this supervisor's random token
  (``FORGELM_TUI_SUPERVISOR``), which its descendants inherit; ``/proc/*/environ`` names them
  (several supervisors of one multi-node run share a run id on one machine, never a token);
- adopted: the supervisor is a child subreaper, so a double-forked orphan reparents to it rather
  than to init; a child of ours outside our own process group that is no rank and not the
  guardian is such an orphan (one that cleared its environment too). Their zombies are reaped
  here, by pid (never ``waitpid(-1)``: that would steal the ranks' exits).

A stop's pass signals the rank groups and the descendants already known, and nothing else: the
scan for new ones (every process's environment, about 0.5-3 ms per hundred processes) runs right
after the pass, on the loop, and they get the same signal then. The same scan runs every
:data:`RECORD_EVERY` seconds (to know a descendant that exited on its own), never per sample.

Once every rank has ended, whatever is left gets SIGTERM, :data:`END_GRACE` to go, then
SIGKILL. Then no scan of every process is needed: a child subreaper adopts every orphan below
it, so all that the ranks left is the children of this process (and their own descendants), read
from ``/proc/self/task/*/children``, a few microseconds when nothing is left. Only where that file
is missing, or this process is no subreaper, is every process scanned at the end.
The guardian (guardian.py) does the environment scan if the supervisor dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from forgelm_tui.engine.guardian import TOKEN_ENV as TOKEN_ENV  # re-exported
from forgelm_tui.engine.guardian import Guardian, new_token, token_needle
from forgelm_tui.engine.records import DescendantRecord, RankRecord
from forgelm_tui.engine.spawn import set_child_subreaper

END_GRACE = 1.0  # after the ranks ended: SIGTERM -> SIGKILL for what they left behind
KILL_WAIT = 0.5  # after a SIGKILL, how long to watch for it to be gone
POLL = 0.05  # how often the end checks what is left (bounded by the two above)
RECORD_EVERY = 5.0  # the rare scan during the run
COMMAND_CHARS = 80


@dataclass(frozen=True)
class ProcStat:
    state: bytes
    ppid: int
    pgid: int
    start: int  # clock ticks after boot


def read_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        fields = data.rpartition(b")")[2].split()
        return ProcStat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:  # gone, or another user's (PermissionError): normal
        return None


def env_value(environ: bytes, name: str) -> str | None:
    key = f"\0{name}=".encode()
    data = b"\0" + environ
    at = data.find(key)
    if at < 0:
        return None
    value = data[at + len(key):].split(b"\0", 1)[0]
    return value.decode("utf-8", "replace")


def command_of(pid: int) -> str:
    """argv[0]'s basename and the rest of a short command line (empty when unreadable)."""
    argv = [a.decode("utf-8", "replace") for a in (_read(f"/proc/{pid}/cmdline") or b"")
            .split(b"\0") if a]
    if not argv:
        comm = _read(f"/proc/{pid}/comm") or b""
        return comm.decode("utf-8", "replace").strip()
    text = " ".join([os.path.basename(argv[0]), *argv[1:]])
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 3] + "..."


def _rank_of(environ: bytes | None) -> int | None:
    value = env_value(environ, "RANK") if environ else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def children() -> set[int] | None:
    """This process's children (any thread's), from /proc; None where the kernel has no such
    file (CONFIG_PROC_CHILDREN): then every process's parent is read instead."""
    kids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        data = _read(f"/proc/self/task/{tid}/children")
        if data is None:
            if os.path.exists(f"/proc/self/task/{tid}"):
                return None
            continue  # the thread ended meanwhile
        kids.update(int(pid) for pid in data.split())
    return kids


def subtree(roots: set[int]) -> set[int]:
    """``roots`` and every process below them, from each one's ``task/*/children`` (the roots
    are this process's children: no scan of every process)."""
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile
        for tid in tasks:
            data = _read(f"/proc/{pid}/task/{tid}/children")
            if data:
                todo.extend(int(child) for child in data.split())
    return found


def reap(pid: int) -> None:
    """Collect an adopted orphan's exit (a zombie of ours that is no rank)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


class Descendants:
    """This supervisor's token, what was found with it, and the stop of what the ranks left."""

    def __init__(self, records: Mapping[int, RankRecord], guardian: Guardian | None = None) -> None:
        """With a guardian, this process is the run's own supervisor (the CLI): it shares the
        guardian's token and becomes a child subreaper. Without one (a test driving the engine
        in-process), only the token finds descendants."""
        self.token = guardian.token if guardian is not None else new_token()
        self.env = {TOKEN_ENV: self.token}  # added to every rank's environment
        self.found: dict[int, DescendantRecord] = {}
        self._records = records
        self._needle = token_needle(self.token)
        self._adopt = guardian is not None and set_child_subreaper()
        self._skip = {os.getpid(), *([guardian.pid] if guardian is not None else [])}
        self._state = "running"  # -> "ending" (the ranks are gone) -> "ended"
        self._handle: asyncio.TimerHandle | None = None
        self._then: Callable[[], None] = lambda: None
        self._began = 0.0
        self._term_mono: dict[int, float] = {}  # pid -> when its first SIGTERM went

    def entries(self) -> list[DescendantRecord]:
        return sorted(self.found.values(), key=lambda d: d.seen_at)

    # ------------------------------------------------------------------ during the run

    def watch(self) -> None:
        """Record the descendants every few seconds (the ranks have started)."""
        self._handle = asyncio.get_running_loop().call_later(RECORD_EVERY, self._record)

    def _record(self) -> None:
        self._refresh()
        self.watch()

    def signal(self, sig: int, *, scan_after: bool = True) -> None:
        """A stop's pass over the rank groups: the same signal to every live descendant. Those
        already known get it now; the scan for new ones runs once the pass is over (the loop's
        next turn: after the stop's events too), and what it finds gets it then. Without
        ``scan_after``, the scan runs first (the last net, where latency does not matter)."""
        if self._state == "ended":
            return
        if not scan_after:
            self._refresh()
        known = [r for r in self.found.values() if r.ended is None and self._still(r)]
        for record in known:
            self._send(record, sig)
        if scan_after:
            done = {r.pid for r in known}
            asyncio.get_running_loop().call_soon(self._signal_new, sig, done)

    def _signal_new(self, sig: int, done: set[int]) -> None:
        if self._state == "ended":
            return
        for record in self._refresh():
            if record.pid not in done:
                self._send(record, sig)

    # ------------------------------------------------------------------ the end

    def stopping(self, then: Callable[[], None]) -> bool:
        """Every rank has ended: stop what they left. True while that is under way (``then``
        is called once it is over); False when nothing is (or is any longer) left."""
        if self._state == "ended":
            return False
        if self._state == "running":
            if self._handle is not None:
                self._handle.cancel()
            self._state, self._then, self._began = "ending", then, time.monotonic()
            if not self._end_pass():
                self._state = "ended"
                return False
        return True

    def _end_pass(self) -> bool:
        """SIGTERM what is new, SIGKILL what had its grace; True while anything is left."""
        now = time.monotonic()
        late = now - self._began >= END_GRACE  # whatever is still here now gets SIGKILL
        live = self._refresh(self._left_behind())
        for record in live:
            sent = [s for s, _ in record.signals]
            termed = self._term_mono.get(record.pid)
            if signal.SIGKILL in sent:
                continue
            if late or (termed is not None and now - termed >= END_GRACE):
                self._send(record, signal.SIGKILL)
            elif signal.SIGTERM not in sent:
                self._send(record, signal.SIGTERM)
        live = [r for r in live if r.ended is None]
        if not live or now - self._began >= END_GRACE + KILL_WAIT:
            return False
        self._handle = asyncio.get_running_loop().call_later(POLL, self._poll)
        return True

    def _poll(self) -> None:
        if not self._end_pass():
            self._state = "ended"
            self._then()

    # ------------------------------------------------------------------ mechanics

    def _send(self, record: DescendantRecord, sig: int) -> None:
        try:
            os.kill(record.pid, sig)
        except ProcessLookupError:
            record.mark_gone()
            return
        except PermissionError:
            record.denied = True
            return
        record.signals.append((sig, time.time()))
        if sig == signal.SIGTERM:
            self._term_mono.setdefault(record.pid, time.monotonic())

    def _refresh(self, found: Iterable[tuple[int, ProcStat, bytes | None, str]] | None = None,
                 ) -> list[DescendantRecord]:
        """Scan (or take what ``found`` found), note what is new, and mark what is gone; the
        live descendants."""
        for pid, stat, environ, how in self._scan() if found is None else found:
            known = self.found.get(pid)
            if known is not None and known.start_ticks == stat.start:
                continue
            self._term_mono.pop(pid, None)
            self.found[pid] = DescendantRecord(pid, stat.start, _rank_of(environ),
                                               command_of(pid), how, time.time())
        return [r for r in self.found.values() if r.ended is None and self._still(r)]

    def _still(self, record: DescendantRecord) -> bool:
        """A known descendant is still the same live process (its pid not reused): one stat
        read, no scan. Marked gone otherwise."""
        if self._alive(record):
            return True
        record.mark_gone()
        return False

    def _alive(self, record: DescendantRecord) -> bool:
        stat = read_stat(record.pid)
        if stat is None or stat.start != record.start_ticks:
            return False
        if stat.state in (b"Z", b"X"):
            if stat.ppid == os.getpid():
                reap(record.pid)
            return False
        return True

    def _left_behind(self) -> Iterator[tuple[int, ProcStat, bytes | None, str]] | None:
        """Every rank has ended: what they left is below this subreaper, its children first.
        None (scan every process) where the children cannot be read or nothing is adopted."""
        kids = children() if self._adopt else None
        if kids is None:
            return None
        return self._scan(sorted(subtree(kids - self._skip)), kids)

    def _scan(self, pids: Iterable[int] | None = None, kids: set[int] | None = None,
              ) -> Iterator[tuple[int, ProcStat, bytes | None, str]]:
        """Live processes carrying the token, and adopted orphans; never a rank or its group.
        ``pids``: only those (what is below this process), else every process."""
        me, own_group = os.getpid(), os.getpgrp()
        ranks = {r.pid for r in self._records.values() if r.pid is not None}
        if pids is None:
            kids = children() if self._adopt else set()
            pids = (int(name) for name in os.listdir("/proc") if name.isdigit())
        for pid in pids:
            if pid in self._skip or pid in ranks:
                continue
            environ = _read(f"/proc/{pid}/environ")
            marked = environ is not None and self._needle in b"\0" + environ
            if not marked and not (self._adopt and (kids is None or pid in kids)):
                continue
            stat = read_stat(pid)
            if stat is None:
                continue
            ours = stat.ppid == me and stat.pgid != own_group
            if stat.state in (b"Z", b"X"):
                if ours:
                    reap(pid)  # an adopted orphan (or a group's leftover) that ended
                continue
            if stat.pgid in ranks:
                continue  # in a rank's group: the group's own signals reach it
            if marked or ours:
                yield pid, stat, environ, "environment" if marked else "adopted"
