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
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable

from forgelm_tui.engine.records import RankRecord, StopRecord
from forgelm_tui.engine.spawn import signal_group
from forgelm_tui.verdict import StopKind


def _exited(pid: int) -> bool:
    """The rank (a child of this process) has ended, not reaped yet. Left to be reaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class EarlyStop:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._pending: StopRecord | None = None  # sent early, not applied by the loop yet

    def signal(self, stop: StopRecord, records: Iterable[RankRecord]) -> bool:
        """Any thread: SIGTERM to every live rank's group now, unless a stop pass already
        began here (or this is a stall's); True when this pass went out."""
        if stop.kind is StopKind.STALL:
            return False
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self._pending = stop
            for record in list(records):
                pid = record.pid
                if pid is None or record.ended_mono is not None or _exited(pid):
                    continue
                # Marked before it goes out: the rank it wakes may end, and the loop read its
                # exit, while this thread waits for the CPU again (measured at 32 nodes x 8
                # ranks on 2 cores: 120 ms); its exit must find it signalled (the loop then
                # waits for this pass and applies the stop first).
                # (A signal that finds nothing unmarks it; a loop that read the mark in
                # between applies the stop before that exit: the verdict is the same.)
                record.early_stop_at = time.time()
                if not signal_group(pid, signal.SIGTERM):
                    record.early_stop_at = None
        return True

    def pending(self) -> StopRecord | None:
        """The stop sent early and not applied yet, if any (once)."""
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

    def close(self) -> None:
        """The loop: no early pass from now on (an early one under way ends first); a stop
        sent early is the loop's to apply from here (its own message, or an exit first)."""
        with self._lock:
            self._closed = True
            self._pending = None
