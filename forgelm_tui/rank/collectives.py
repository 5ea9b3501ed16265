"""How many collectives each process group has entered, read inside the rank and sent on the
channel: the strongest evidence of progress (docs/progress.md, "Collectives").

Every torch.distributed process group numbers its collectives (``ProcessGroup.
_get_sequence_number_for_group()``: gloo and NCCL alike, without the flight recorder). A
background thread here waits until the program has initialised torch.distributed (it never
imports torch itself: a program that does not use it pays nothing), then reads every group's
number once a second (a counter read, no lock) and sends them when they change. A rank whose
count moved entered a new collective, so its last one completed: every rank of that group took
part, whatever its ranks print. A rank stuck in a collective, or one that never enters it,
keeps its count.

Why not the flight recorder's status (``_dump_fr_trace_json``): called from a thread while the
main thread runs collectives, it hung a rank at its first collectives (the dump holds the GIL
while it waits for the recorder's lock; the recorder frees entries holding Python frames under
that lock): seen on the real SLURM test cluster. Why not torch's worker server: a Python handler
on it aborts the interpreter at exit (``Fatal Python error: PyThreadState_Get``, torch 2.13).

Nothing here may change the program's outcome: an error skips a read; repeated errors stop the
watching, silently.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Sequence

# What the runner imports at a rank's start is only what ``python -m`` has loaded already:
# a rank's start is on the exit -> peer path and the no-op overhead (bench/RESULTS.md). The
# channel, threading and signal are imported once torch.distributed is (``_start``).
COLLECTIVES_ENV = "FORGELM_TUI_COLLECTIVES"  # "1": send the collective counts (docs/progress.md)
READ_EVERY_S = 1.0
MAX_GROUPS = 64  # process groups sent per message (a datagram holds ~8 KB)

Counts = dict[str, int]  # process group name -> collectives entered
MAX_ERRORS = 10  # reads in a row that failed: the watching stops
Send = Callable[..., object]


def install(send: Send | None = None) -> bool:
    """Watch once the program imports torch.distributed, when the supervisor asked for it
    (``FORGELM_TUI_COLLECTIVES``), sending on ``send`` (the rank's default channel when
    None). Until then nothing runs: no thread is started in a program
    that never uses torch.distributed (a thread alone changes a process: glibc then handles its
    reserved signal 33 itself, which no longer ends it)."""
    if os.environ.get(COLLECTIVES_ENV) != "1":
        return False
    start = functools.partial(_start, send)
    if "torch.distributed" in sys.modules:
        start()
    else:
        sys.meta_path.insert(0, AfterImport("torch.distributed", start))
    return True


def _start(send: Send | None) -> None:
    """In the main thread, as torch.distributed's import ends: what the watcher needs is
    imported here, not by its thread while the program's imports go on."""
    import threading

    if send is None:
        from forgelm_tui.rank.channel import default_channel
        send = default_channel().send
    from forgelm_tui.channel import MessageKind

    report = functools.partial(send, MessageKind.COLLECTIVES)
    threading.Thread(target=_watch, args=(report,), name="forgelm-tui-collectives",
                     daemon=True).start()
    atexit.register(ending, report)  # before torch's own exit handlers run (last in, first out)


def ending(report: Send) -> None:
    """The program is over (it returned, or sys.exit): its groups make no gap from now on,
    whatever the watcher said last (a daemon thread: the interpreter's teardown, seconds on a
    busy machine, may come before its next read)."""
    with contextlib.suppress(Exception):
        report(groups={})


class AfterImport:  # a meta path finder (importlib.abc's base costs 8 ms to import)
    """Calls ``then`` once the module ``name`` has been executed (the first import), then
    leaves ``sys.meta_path``; the import itself is the other finders' and loaders', unchanged."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname) if path is None else next(
            (found for finder in sys.meta_path
             if (found := getattr(finder, "find_spec", lambda *a: None)(fullname, path, target))
             is not None), None)
        loader = getattr(spec, "loader", None)
        if spec is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module  # type: ignore[union-attr]
        then = self.then

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            with contextlib.suppress(Exception):  # never the program's problem
                then()

        loader.exec_module = exec_module  # type: ignore[union-attr]  # this module's loader
        return spec


def _watch(report: Send) -> None:
    import signal
    import threading

    # Signals stay the main thread's: a process-directed signal must reach the program exactly
    # as it would without this thread.
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    stop = threading.Event()
    last: Counts | None = None
    errors = 0
    while errors < MAX_ERRORS and not stop.wait(READ_EVERY_S):
        try:
            counts = read_counts()
        except Exception:  # a group made or destroyed during the read: the next one
            errors += 1
            continue
        errors = 0
        said, last = to_say(counts, last)
        if said is not None:
            with contextlib.suppress(Exception):
                report(groups=said)


def to_say(counts: Counts | None, last: Counts | None) -> tuple[Counts | None, Counts | None]:
    """What to report of a read (None: nothing), and what was last reported. Counts that
    changed, at most MAX_GROUPS groups; once the program destroyed its groups (counts gone
    after some were said), no group once: its last counts, frozen, are no gap of a rank
    that is ending (the supervisor would read the ranks' different last counts as a hang)."""
    if counts is None:
        return ({}, None) if last else (None, last)
    if counts == last:
        return None, last
    return dict(list(counts.items())[:MAX_GROUPS]), counts


def read_counts() -> Counts | None:
    """How many collectives each process group entered, once the program initialised
    torch.distributed; None before (and after it destroyed its groups)."""
    dist = sys.modules.get("torch.distributed")
    initialized = getattr(dist, "is_initialized", None)
    if initialized is None or not initialized():
        return None
    world = getattr(sys.modules.get("torch.distributed.distributed_c10d"), "_world", None)
    if world is None:
        return None
    names = dict(world.pg_names)
    return {str(names.get(pg, index)): int(pg._get_sequence_number_for_group())
            for index, pg in enumerate(list(world.pg_map))}
