"""torch's own NCCL flight-recorder dumps, into the run dir and asked for at a stall (issue 22).

ProcessGroupNCCL keeps a flight recorder (the last 2,000 collectives by default, with their
sizes and Python stacks) and writes it to ``<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>``
(a place every job of the user shares, unless set) when its watchdog times out, and whenever
something is written to the named pipe ``<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`` that
it creates when that variable is set (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp,
``DumpPipe``; its heartbeat monitor thread reads it, so a rank whose main thread hangs still
dumps). forgelm-tui, with ``--collective-trace on``:

- gives every rank both variables, under its run dir (``nccl-trace-rank-<rank>``,
  ``nccl-pipe-rank-<rank>.pipe``), unless the user set them (``TORCH_FR_DUMP_TEMP_FILE`` is the
  newer spelling of the first): each node keeps its ranks' dumps, none in a shared place;
  the pipe only where a FIFO can be made (engine/spec.fifos_work);
- at a stall (and when stacks are asked for), writes one byte to the pipe of each rank whose
  pipe is there (a rank without NCCL has none, and a pipe nobody reads is left alone), and the
  capture waits for those dumps as for the stacks, within the same deadline (2 s by default):
  the stall's stop comes after them, or at the deadline (a rank stopped first might die
  before its recorder wrote; torch reads the pipe about once a second);
- lists each rank's dump in the envelope (``ranks[].nccl_dump_file``, and after the stacks in
  ``hang.trace_files``) when one was written after the rank started, at the place the rank was
  given (ours or the user's; with neither, none is looked for): the dumps are torch's own
  format (a pickle by default), for torch's ``fr_trace`` analyser; nothing here reads them.

Gloo records nothing of this: its ranks never create the pipe. Not run on a GPU yet
(docs/progress.md); tests drive the pipe with a rank that plays torch's part.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Mapping, Sequence

# (the spec gives the ranks these places, dump_env: the launch spec imports no process code)
from forgelm_tui.engine.spec import DUMP_VARS, PIPE_VAR

SETTLE = 0.1  # a dump is written once its file has not grown for this long
POLL = 0.02


def places(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The pipe stem and the dump stem of a rank started with ``env`` (each + its rank); None
    where the variable is not set (torch's default place is shared with every other job of
    the user: a file there is not known to be this rank's)."""
    dump = next((env[var] for var in DUMP_VARS if env.get(var)), None)
    return env.get(PIPE_VAR) or None, dump


def request(pipe_stem: str | None, rank: int) -> bool:
    """Ask the rank's NCCL process group for a dump now: one byte to its pipe. False when it
    has none (no NCCL, the variable not set, or nobody reads it): never blocks."""
    if pipe_stem is None:
        return False
    path = f"{pipe_stem}{rank}.pipe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)  # ENXIO: no reader
    except OSError:
        return False
    try:  # what was opened, not what the path named a moment before
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def dump_file(dump_stem: str | None, rank: int, since: float | None) -> str | None:
    """The rank's dump, when one was written since ``since`` (epoch seconds; an older run's,
    or an older request's, is not it)."""
    if dump_stem is None:
        return None
    path = f"{dump_stem}{rank}"
    return path if _fresh_size(path, since) > 0 else None


async def written(dumps: Sequence[tuple[str, int]], since: float, until: float) -> None:
    """Wait, until ``until`` (monotonic) at most, for each (dump stem, rank)'s dump asked for
    at ``since`` (epoch) to be written: there, and not grown for SETTLE."""
    sizes: dict[int, tuple[int, float]] = {}
    left = list(dumps)
    while left and time.monotonic() < until:
        await asyncio.sleep(POLL)
        now = time.monotonic()
        for stem, rank in list(left):
            size = _fresh_size(f"{stem}{rank}", since)
            if sizes.get(rank, (None, 0.0))[0] != size:
                sizes[rank] = (size, now)
            elif size > 0 and now - sizes[rank][1] >= SETTLE:
                left.remove((stem, rank))


def _fresh_size(path: str, since: float | None) -> int:
    """The size of the regular file at ``path`` written since ``since``; -1 for anything
    else (none, older, not a file)."""
    try:
        info = os.stat(path)
    except OSError:
        return -1
    fresh = since is None or info.st_mtime >= since - 0.05
    return info.st_size if stat.S_ISREG(info.st_mode) and fresh else -1
