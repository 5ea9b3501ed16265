"""Another node's stop, signalled by the thread that read it (issue 23; docs/multinode.md).

A stop broadcast by another node is read by the link's inbox thread, and its ranks used to
be signalled once the event loop got to it: a second thread to be scheduled, on a node whose
CPUs are busy (measured at 32 nodes x 8 ranks on 2 cores: the inbox thread had the stop 15-40
ms after the failure, the loop signalled 3-85 ms after that). So the inbox thread sends the
stop's one pass itself: SIGTERM to every live rank's group, what the policy's ``begin`` would
send, then posts the stop to the loop as before. The loop records each of those signals with
the time it went out (``RankRecord.early_stop_at``) and sends none again:

- the early pass happens at most once, and never once this node's own stop pass began
  (``close``: the loop's first stop pass, or a remote stop applied, closes it);
- a stall's stop is never sent early (every rank's stacks come first);
- a rank signalled early counts as signalled from then on (``signalled_first``): its own
  report of the SIGTERM, read before the loop applied the stop, is no outside stop; and when
  it dies of it first, the loop applies the pending stop before it reads that exit;
- a rank that already ended (not reaped yet) is not signalled: it ended on its own, and its
  exit is read before the stop is applied.

The pass may also go out before the stop's record is read (``signal(None, ...)``: cluster/
alarm.py wakes on the store's alarm, one round trip, and sends it at once; the record takes a
second round trip, on a busy store tens of ms later). Until the record is given (``signal``
again, with it) the exit of a rank signalled by that pass is held, not read: read without its
stop, a rank that died of it would look killed from outside. The link posts :meth:`release`
once the record is given; a stop of this node's own (the store's loss is one) has them read
at once, after it is applied; and they are read anyway after ``RECORD_WAIT``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

from forgelm_tui.engine.records import RankRecord, StopRecord
from forgelm_tui.engine.spawn import signal_group
from forgelm_tui.engine.timers import LoopTimers
from forgelm_tui.verdict import StopKind

RECORD_WAIT = 5.0  # held exits are read after this, the early pass's record come or not


def _exited(pid: int) -> bool:
    """The rank (a child of this process) has ended, not reaped yet. Left to be reaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class EarlyStop:
    def __init__(self, timers: LoopTimers | None = None,
                 read_exit: Callable[[RankRecord, int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._pending: StopRecord | None = None  # sent early, not applied by the loop yet
        self._awaited = False  # sent early, its record not given yet
        self._held: list[tuple[RankRecord, int]] = []  # exits read once it is
        self._timers = timers
        self._read_exit = read_exit

    def signal(self, stop: StopRecord | None, records: Iterable[RankRecord]) -> bool:
        """Any thread: SIGTERM to every live rank's group now, unless a stop pass already
        began here (or this is a stall's); True when this pass went out. ``stop`` None: its
        record is on its way, given by a later call (which then sends nothing)."""
        if stop is not None and stop.kind is StopKind.STALL:
            return False
        with self._lock:
            if self._closed:
                if self._awaited and stop is not None:
                    self._pending, self._awaited = stop, False
                return False
            self._closed = True
            self._pending, self._awaited = stop, stop is None
            targets = [r for r in list(records) if r.pid is not None and r.ended_mono is None
                       and not _exited(r.pid)]
            for record in targets:
                # Marked before it goes out: the rank it wakes may end, and the loop read its
                # exit, while this thread waits for the CPU again (measured at 32 nodes x 8
                # ranks on 2 cores: 120 ms); its exit must find it signalled (the loop then
                # waits for this pass and applies the stop first).
                # (A signal that finds nothing unmarks it; a loop that read the mark in
                # between applies the stop before that exit: the verdict is the same.)
                record.early_stop_at = time.time()
                if not signal_group(record.pid or 0, signal.SIGTERM):
                    record.early_stop_at = None
        return True

    def pending(self) -> StopRecord | None:
        """The stop sent early and not applied yet, if any (once)."""
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

    def hold(self, record: RankRecord, returncode: int) -> bool:
        """The loop: True when the exit of a rank this pass signalled waits for the pass's
        record (read by :meth:`release`)."""
        if record.early_stop_at is None:
            return False
        with self._lock:
            if not self._awaited:
                return False
            self._held.append((record, returncode))
            first = len(self._held) == 1
        if first and self._timers is not None:
            self._timers.start("early-record", RECORD_WAIT, self.release)
        return True

    def release(self) -> None:
        """The loop: the record was given (or will not be): read the held exits."""
        if self._timers is not None:
            self._timers.cancel("early-record")
        with self._lock:
            held, self._held, self._awaited = self._held, [], False
        for record, returncode in held:
            if self._read_exit is not None:
                self._read_exit(record, returncode)

    def close(self) -> None:
        """The loop: no early pass from now on (an early one under way ends first); a stop
        sent early is the loop's to apply from here (its own message, or an exit first)."""
        with self._lock:
            self._closed = True
            self._pending = None
            self._awaited = False
            held = bool(self._held)
        if held and self._timers is not None:  # read once this pass of the loop is over
            self._timers.start("early-record", 0.0, self.release)
