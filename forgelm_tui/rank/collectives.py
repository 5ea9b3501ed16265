"""Each process group's collective counts, read inside the rank and sent on the channel: the
strongest evidence of progress (docs/progress.md, "Collectives").

torch's flight recorder (``TORCH_FR_BUFFER_SIZE`` > 0, set by the supervisor unless the user
set it) counts every process group's collectives, gloo's as well as NCCL's: enqueued (the rank
entered it) and completed. A background thread here waits until the program has initialised
torch.distributed (it never imports torch itself: a program that does not use it pays nothing),
then reads those counts once a second (``_dump_fr_trace_json`` without the entries: ~230 bytes,
~0.1 ms) and sends them when they change. A completed count that moves means every rank of that
group took part: the group trains, whatever its ranks print.

Why not a handler on torch's worker server (``_register_handler``): a Python handler aborts the
interpreter at exit (``Fatal Python error: PyThreadState_Get`` when the registry is destroyed
after finalisation, torch 2.13): it would change the program's outcome. And torch's own
``fr_trace_json`` handler returns every entry (~480 B each, ~1 MB at 2000) on each read.

Nothing here may change the program's outcome: any error stops the watching, silently.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

from forgelm_tui.channel import COLLECTIVES_ENV, MessageKind

READ_EVERY_S = 1.0
MAX_GROUPS = 64  # process groups sent per message (a datagram holds ~8 KB)

Counts = dict[str, list[int]]  # process group id -> [enqueued, completed]


def install(send: Callable[..., Any]) -> bool:
    """Watch once the program imports torch.distributed, when the supervisor asked for it
    (``FORGELM_TUI_COLLECTIVES``). Until then nothing runs: no thread is started in a program
    that never uses torch.distributed (a thread alone changes a process: glibc then handles its
    reserved signal 33 itself, which no longer ends it)."""
    if os.environ.get(COLLECTIVES_ENV) != "1":
        return False
    start = functools.partial(_start, send)
    if "torch.distributed" in sys.modules:
        start()
    else:
        sys.meta_path.insert(0, _AfterImport("torch.distributed", start))
    return True


def _start(send: Callable[..., Any]) -> None:
    threading.Thread(target=_watch, args=(send,), name="forgelm-tui-collectives",
                     daemon=True).start()


class _AfterImport(importlib.abc.MetaPathFinder):
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


def _watch(send: Callable[..., Any]) -> None:
    # Signals stay the main thread's: a process-directed signal must reach the program exactly
    # as it would without this thread.
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    stop = threading.Event()
    last: Counts | None = None
    with contextlib.suppress(Exception):  # never the program's problem
        while not stop.wait(READ_EVERY_S):
            counts = read_counts()
            if counts is None or counts == last:
                continue
            last = counts
            send(MessageKind.COLLECTIVES, groups=dict(list(counts.items())[:MAX_GROUPS]))


def read_counts() -> Counts | None:
    """Every process group's [enqueued, completed], once the program initialised
    torch.distributed; None before (or when torch records nothing)."""
    dist = sys.modules.get("torch.distributed")
    initialized = getattr(dist, "is_initialized", None)
    if initialized is None or not initialized():
        return None
    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    return parse_status(dump(includeCollectives=False, onlyActive=False))


def parse_status(data: bytes | str) -> Counts | None:
    """``pg_status`` of a flight recorder dump as counts; None when it has none."""
    status = json.loads(data).get("pg_status")
    if not isinstance(status, dict) or not status:
        return None
    return {str(pg): [int(s.get("last_enqueued_collective", -1)),
                      int(s.get("last_completed_collective", -1))]
            for pg, s in status.items() if isinstance(s, dict)}
