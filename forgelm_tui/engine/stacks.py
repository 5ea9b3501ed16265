"""Where every rank is stuck: each live rank's Python stacks (all threads), within a deadline.

For each rank, concurrently (docs/progress.md, "Where the ranks were stuck"):

1. a rank that announced the stacks handler on the channel (``rank.stacks``: faulthandler on
   the reserved signal) gets that signal, to its main process only; its handler appends every
   thread's stack to ``rank-N.stacks.txt`` in the run dir, read once it stops growing;
2. else, or when no dump came in the first half of the deadline, ``py-spy dump`` when it is
   installed (``pip install 'forgelm-tui[stacks]'``; it needs ptrace permission);
3. else no stacks, and a note that says why.

A rank that did not announce the handler never gets the signal: a real-time signal's default
action would end it. The capture ends at its deadline whatever the ranks do; what was not read
by then is a note. One capture at a time: a request while one runs joins it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from forgelm_tui.channel import STACKS_SIGNAL, stacks_file_name
from forgelm_tui.engine import events as ev
from forgelm_tui.engine import nccl_dump
from forgelm_tui.engine.records import RankRecord
from forgelm_tui.engine.stack_text import faulthandler_threads, innermost, py_spy_threads
from forgelm_tui.isotime import now_iso
from forgelm_tui.private_files import open_private
from forgelm_tui.signames import signal_name

SETTLE = 0.1  # a dump is complete once its file has not grown for this long
POLL = 0.02
FINISH_MARGIN = 0.1  # the capture ends this much before the deadline the stop keeps
PY_SPY_HINT = "pip install 'forgelm-tui[stacks]' for py-spy"

SignalRank = Callable[[RankRecord, str], bool]  # the rank, why


def find_py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter (a virtualenv that is not activated)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if os.access(beside, os.X_OK) else None)


class StackCapture:
    def __init__(self, run_dir: Path, signal_rank: SignalRank,
                 emit: Callable[[ev.Event], None], *, deadline: float = 2.0,
                 signum: int = STACKS_SIGNAL, py_spy: str | None = None) -> None:
        self.run_dir = run_dir
        self.deadline = deadline
        self.signum = signum
        self.py_spy = py_spy
        self._signal_rank = signal_rank
        self._emit = emit
        self._task: asyncio.Task[ev.StacksCaptured] | None = None
        self._targets: dict[int, RankRecord] = {}
        self._waiters: list[Callable[[], None]] = []
        self._asked: dict[int, str] = {}  # rank -> what its capture waits on now (late notes)

    @property
    def busy(self) -> bool:
        return self._task is not None

    def start(self, records: Sequence[RankRecord], reason: str,
              done: Callable[[], None] | None = None) -> bool:
        """Capture the live ranks' stacks; ``done`` once they are in (at most the deadline).
        True when this call began a capture; a capture under way is joined instead."""
        if done is not None:
            self._waiters.append(done)
        if self._task is not None:
            return False
        targets = [r for r in records if r.alive]
        if not targets:
            self._call_waiters()
            return False
        self._targets = {r.rank: r for r in targets}
        self._task = asyncio.get_running_loop().create_task(self.capture(targets, reason))
        self._task.add_done_callback(self._finished)
        return True

    def close(self) -> None:
        """The run is over: a capture still under way is dropped."""
        self._waiters.clear()
        if self._task is not None:
            self._task.cancel()

    def _finished(self, task: asyncio.Task[ev.StacksCaptured]) -> None:
        self._task = None
        if task.cancelled():
            return
        if task.exception() is None:  # (a bug here must not hold the stop: waiters go on)
            captured = task.result()
            for stacks in captured.ranks:
                self._targets[stacks.rank].stacks = stacks
            self._emit(captured)
        self._call_waiters()

    def _call_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for done in waiters:
            done()

    async def capture(self, targets: Sequence[RankRecord], reason: str) -> ev.StacksCaptured:
        """Every target's stacks, concurrently; those not read by the deadline get a note."""
        began, began_at = time.monotonic(), time.time()
        self._asked = {}
        until = began + max(0.0, self.deadline - FINISH_MARGIN)
        jobs = {r.rank: asyncio.ensure_future(self._one(r, reason, until)) for r in targets}
        # NCCL's own flight recorder too, where a rank has one (engine/nccl_dump.py)
        dumps = [(r.nccl_dump, r.rank) for r in targets
                 if r.nccl_dump and nccl_dump.request(r.nccl_pipe, r.rank)]
        written = asyncio.ensure_future(nccl_dump.written(dumps, began_at, until))
        await asyncio.wait([*jobs.values(), written], timeout=max(0.0, until - time.monotonic()))
        written.cancel()
        late = [job for job in jobs.values() if not job.done()]
        for job in late:
            job.cancel()
        if late:  # a moment to kill and reap a py-spy still running: it takes milliseconds
            await asyncio.wait(late, timeout=FINISH_MARGIN / 2)
        results = []
        for record in targets:
            job = jobs[record.rank]
            if job.cancelled() or not job.done():  # on a loaded machine, also its own timer's
                note = f"no stacks within the {self.deadline:g} s deadline"
                if asked := self._asked.get(record.rank):
                    note += f" ({asked} had not answered in time)"
                results.append(ev.RankStacks(record.rank, None, None, None, note))
            elif (error := job.exception()) is not None:
                note = f"capture failed: {error}"
                results.append(ev.RankStacks(record.rank, None, None, None, note))
            else:
                results.append(job.result())
        return ev.StacksCaptured(reason, tuple(results), began_at,
                                 round(time.monotonic() - began, 3))

    async def _one(self, record: RankRecord, reason: str, until: float) -> ev.RankStacks:
        path = self.run_dir / stacks_file_name(record.rank)
        handler = record.stacks_handler
        if handler is None:
            note = "it did not announce forgelm-tui's stacks handler (no forgelm_tui.rank)"
        elif handler.signum != self.signum:
            note = (f"its handler is on {signal_name(handler.signum)}, not the reserved "
                    f"{signal_name(self.signum)}")
        elif not _same_file(handler.file, path):
            note = f"its handler writes to {handler.file}, not to the run dir"
        else:
            # half the time when py-spy may try next; else all of it, and a note in time
            give_up = (time.monotonic() + until) / 2 if self.py_spy else until - 2 * POLL
            text = await self._faulthandler(record, path, reason, give_up)
            if text is not None:
                return ev.RankStacks(record.rank, innermost(faulthandler_threads(text),
                                                            handler.thread),
                                     str(path), "faulthandler")
            note = "its handler wrote nothing in time (the signal ignored or blocked?)"
        if self.py_spy is None:
            return ev.RankStacks(record.rank, None, None, None, f"{note}; {PY_SPY_HINT}")
        found = await self._py_spy(record, path, reason, until)
        if found.via is None:
            return replace(found, note=f"{note}; {found.note}")
        return replace(found, note=f"{note}; read by py-spy") if handler is not None else found

    async def _faulthandler(self, record: RankRecord, path: Path, reason: str,
                            until: float) -> str | None:
        """Signal the rank and wait for its dump: the file grew, then stopped growing."""
        offset = _append(path, _header(record, reason, "faulthandler"))
        if offset is None or not self._signal_rank(record, f"where is it stuck ({reason})"):
            return None
        self._asked[record.rank] = "its handler"
        size, changed = offset, time.monotonic()
        while time.monotonic() < until:
            await asyncio.sleep(POLL)
            now_size = _size(path)
            if now_size != size:
                size, changed = now_size, time.monotonic()
            elif size > offset and time.monotonic() - changed >= SETTLE:
                break
        if size <= offset:
            return None
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read(size - offset).decode("utf-8", "replace")

    async def _py_spy(self, record: RankRecord, path: Path, reason: str,
                      until: float) -> ev.RankStacks:
        assert self.py_spy is not None and record.pid is not None
        try:
            proc = await asyncio.create_subprocess_exec(
                self.py_spy, "dump", "--pid", str(record.pid), "--full-filenames",
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            return ev.RankStacks(record.rank, None, None, None, f"py-spy did not start: {exc}")
        self._asked[record.rank] = "py-spy"
        try:
            out, err = await asyncio.wait_for(proc.communicate(),
                                              max(0.0, until - 2 * POLL - time.monotonic()))
        except TimeoutError:
            return ev.RankStacks(record.rank, None, None, None, "py-spy did not answer in time")
        finally:
            if proc.returncode is None:  # out of time (or the capture was dropped): reap it
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        text = out.decode("utf-8", "replace")
        threads = py_spy_threads(text)
        if proc.returncode != 0 or not threads:
            return ev.RankStacks(record.rank, None, None, None,
                                 _py_spy_failure(err.decode("utf-8", "replace")))
        if _append(path, _header(record, reason, "py-spy") + text) is None:  # a full run dir
            return ev.RankStacks(record.rank, innermost(threads, record.pid), None, "py-spy",
                                 f"not written to {path} (the run dir cannot be written)")
        return ev.RankStacks(record.rank, innermost(threads, record.pid), str(path), "py-spy")


def _py_spy_failure(stderr: str) -> str:
    lowered = stderr.lower()
    if "permission" in lowered or "not permitted" in lowered:
        return ("py-spy was not permitted to read the rank (ptrace): run forgelm-tui as root, "
                "with CAP_SYS_PTRACE, or with kernel.yama.ptrace_scope = 0")
    line = next((ln.strip() for ln in stderr.splitlines() if ln.strip()), "no output")
    return f"py-spy failed: {line.removeprefix('Error: ')[:200]}"


def _header(record: RankRecord, reason: str, via: str) -> str:
    at = now_iso()
    return (f"\n=== forgelm-tui: rank {record.rank} (pid {record.pid}), {at}, {reason}: "
            f"every thread, most recent call first, via {via} ===\n")


def _append(path: Path, text: str) -> int | None:
    """Append (O_APPEND, as the rank's handler writes); the file's size after, or None."""
    try:
        fd = open_private(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.write(fd, text.encode("utf-8", "replace"))
        return os.fstat(fd).st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _same_file(announced: str, path: Path) -> bool:
    return os.path.realpath(announced) == os.path.realpath(path)
