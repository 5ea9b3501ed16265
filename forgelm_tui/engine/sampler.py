"""Per-rank resource samples with psutil: CPU, memory, children, CPU-time progress."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

# A rank whose CPU time grew by less than this fraction of the interval counts as idle: a rank
# blocked in a collective or at a barrier burns almost nothing.
IDLE_CPU_FRACTION = 0.02
CHILDREN_EVERY = 5  # building the process tree is costly: do it every fifth sample


@dataclass(frozen=True)
class Sample:
    cpu_percent: float
    rss_bytes: int
    cpu_seconds: float
    children: int | None  # None when not counted this time


class RankSampler:
    """Samples one rank process; created once, primed so the first percent is meaningful."""

    def __init__(self, pid: int) -> None:
        self._process: psutil.Process | None
        try:
            self._process = psutil.Process(pid)
            self._process.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._process = None
        self._ticks = 0

    def sample(self) -> Sample | None:
        if self._process is None:
            return None
        self._ticks += 1
        try:
            with self._process.oneshot():
                cpu = self._process.cpu_percent(None)
                rss = self._process.memory_info().rss
                times = self._process.cpu_times()
                children = None
                if self._ticks % CHILDREN_EVERY == 1:
                    children = len(self._process.children(recursive=True))
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            self._process = None
            return None
        seconds = times.user + times.system + times.children_user + times.children_system
        return Sample(cpu, rss, seconds, children)
