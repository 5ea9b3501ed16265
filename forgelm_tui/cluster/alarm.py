"""The stop alarm: a node's SIGTERM pass one round trip after another node's stop is
published (issue 23; docs/multinode.md, "One stop").

The inbox reads a broadcast in two round trips to node 0's store (``get`` waits for the key,
then asks for its value): measured at 32 nodes x 8 ranks on 2 cores, every node's wait ended
8-11 ms after the failure, and the value came 2-90 ms after that, the store's thread by then
queued behind the ranks the first nodes had just signalled. So the publisher of a stop that
won (not a stall's: every node's stacks come first) also writes ``alarm``, and every node has
a thread that only waits for that key (a wait answers with no value: one round trip). On its
wake the node sends its SIGTERM pass at once, the stop's record to follow
(engine/early_stop.py: ``signal(None)``), then reads the record (``stop``), gives it, and has
the loop read the exits it held meanwhile. A node whose own stop began (the publisher's, or one
applied already) sends nothing. The inbox still brings the stop as before: whichever of the two
threads gives the record first, the pass goes out once.

Its cost in steady state: one wait a node, renewed every ``ALARM_WAIT`` (a timed-out wait is
cancelled by the client: two small messages each way).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from forgelm_tui.cluster.store import Connections, StoreLost, StoreTimeout
from forgelm_tui.cluster.traffic import ALARM
from forgelm_tui.cluster.wire import others_stop
from forgelm_tui.engine.supervisor import Supervisor

ALARM_WAIT = 1.0  # one wait; the thread checks for shutdown between two
RECORD_READ = 10.0  # the record's read, once woken (a starved store answers late, not never)


def alarm_thread(sup: Supervisor, connections: Connections, me: int, closed: threading.Event,
                 post: Callable[[Callable[[], None]], None]) -> None:
    """Wait for the alarm, send the SIGTERM pass, give its record; once (then the thread
    ends). A store that cannot be reached is the inbox's and the ticker's to report."""
    try:
        store = connections.spare(ALARM_WAIT)
        while not store.wait_for(ALARM, ALARM_WAIT):
            if closed.is_set():
                return
        if closed.is_set() or sup.stop is not None:
            return  # this node's own stop, or one it applied: its pass went out already
        sup.early_stop(None)  # now; the record follows
        store.set_timeout(RECORD_READ)
        data = store.get("stop")
    except (StoreLost, StoreTimeout):
        return  # the inbox gives the record, or the held exits are read after RECORD_WAIT
    early = others_stop({"stop": data}, me)
    if early is not None:
        sup.early_stop(early)
    post(sup.early_exits)  # the held exits are read now (a record not well formed: as they are)
