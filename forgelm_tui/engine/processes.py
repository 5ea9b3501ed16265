"""Rank processes: spawn each in its own session, reap it by pidfd, signal it and its group.

Mechanics only: which signal to send and when is the stop policy's business.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from forgelm_tui.engine import nccl_dump
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.loop import exits_first
from forgelm_tui.engine.records import RankRecord
from forgelm_tui.engine.spawn import (
    OutputPipes,
    group_alive,
    signal_group,
    signal_process,
    spawn_rank,
)

ExitHandler = Callable[[RankRecord, int], None]


class RankProcesses:
    def __init__(self, loop: asyncio.AbstractEventLoop, on_exit: ExitHandler,
                 guardian: Guardian | None = None) -> None:
        self._loop = loop
        self._on_exit = on_exit
        self._guardian = guardian
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, record: RankRecord, argv: tuple[str, ...], env: Mapping[str, str],
              cwd: Path | None, pipe_size: int) -> tuple[int, OutputPipes]:
        """Spawn the rank (its pid, its output); its exit arrives later through ``on_exit``
        (OSError if it cannot)."""
        proc, pipes = spawn_rank(argv, env, cwd, pipe_size=pipe_size)
        if self._guardian is not None:
            self._guardian.watch(proc.pid)
        record.mark_started(proc.pid)
        record.nccl_pipe, record.nccl_dump = nccl_dump.places(env)
        self.procs[record.rank] = proc
        self._watch_exit(record, proc)
        return proc.pid, pipes

    def _watch_exit(self, record: RankRecord, proc: subprocess.Popen[bytes]) -> None:
        """Exit as an event: a pidfd becomes readable when the process ends."""
        loop = self._loop
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            # No pidfd (old kernel): a thread blocked in wait() is still an event, not a poll.
            def wait() -> None:
                proc.wait()
                loop.call_soon_threadsafe(self._exited, record, None)

            threading.Thread(target=wait, name=f"wait-rank-{record.rank}", daemon=True).start()
            return
        loop.add_reader(pidfd, self._exited, record, pidfd)
        exits_first(loop, pidfd)

    def _exited(self, record: RankRecord, pidfd: int | None) -> None:
        """Reap, tell (the peers' SIGTERM goes out there), then forget the pidfd."""
        proc = self.procs[record.rank]
        returncode = proc.returncode if pidfd is None else _reap(pidfd)
        if returncode is None:  # no P_PIDFD here (_reap): the ended rank, reaped by pid
            returncode = proc.wait()
        proc.returncode = returncode  # Popen knows it ended: no ResourceWarning, no waitpid
        try:
            self._on_exit(record, returncode)
        finally:
            if pidfd is not None:
                self._loop.remove_reader(pidfd)
                exits_first(self._loop, pidfd, False)
                os.close(pidfd)

    def signal(self, record: RankRecord, sig: int, *, group: bool) -> bool:
        """Signal the rank's process group (stops, kills) or its main process (forwards)."""
        if record.pid is None:
            return False
        return signal_group(record.pid, sig) if group else signal_process(record.pid, sig)

    def leftovers(self, records: Iterable[RankRecord]) -> list[RankRecord]:
        """SIGKILL what is left in ended ranks' groups (orphaned children); who had any."""
        return [r for r in records if r.pid is not None and group_alive(r.pid)
                and signal_group(r.pid, signal.SIGKILL)]

    def release(self, records: Iterable[RankRecord]) -> None:
        """Every rank has been dealt with: the guardian need not watch their groups."""
        if self._guardian is not None:
            for record in records:
                if record.pid is not None:
                    self._guardian.forget(record.pid)


def _reap(pidfd: int) -> int | None:
    """The ended process's returncode, as Popen gives it (-N: killed by signal N)."""
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except OSError:  # a kernel with pidfd_open but no P_PIDFD (5.3): Popen's waitpid then
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
