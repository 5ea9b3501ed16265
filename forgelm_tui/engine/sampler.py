"""Sampling: per-rank resources with psutil (CPU, memory, children, CPU-time progress)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psutil

from forgelm_tui.engine.events import Gauges
from forgelm_tui.engine.gpu import GpuPass, GpuSampler
from forgelm_tui.engine.gpu_events import GpuDevice, GpuSampled, RankGpu
from forgelm_tui.engine.records import Evidence, RankRecord

# A rank whose CPU time grew by less than this fraction of the interval counts as idle: a rank
# blocked in a collective or at a barrier burns almost nothing.
IDLE_CPU_FRACTION = 0.02
CHILDREN_EVERY = 5  # building the process tree is costly: do it every fifth sample


@dataclass(frozen=True)
class Sample:
    cpu_seconds: float
    # What the rank table shows, by its column key (rank_table.COLUMNS); a key left out keeps
    # its last value (children are counted every CHILDREN_EVERY samples). A new sampled column
    # is a key here and a Column there.
    gauges: Gauges
    caught_mask: int = 0  # signals with a handler (bit N-1 for signal N)
    ignored_mask: int = 0  # signals set to SIG_IGN


def signal_masks(pid: int) -> tuple[int, int]:
    """The process's caught and ignored signal masks (Linux /proc; 0, 0 elsewhere)."""
    caught = ignored = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"SigCgt:"):
                    caught = int(line.split()[1], 16)
                elif line.startswith(b"SigIgn:"):
                    ignored = int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return caught, ignored


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
                gauges: Gauges = {"cpu": self._process.cpu_percent(None),
                                  "rss": float(self._process.memory_info().rss)}
                times = self._process.cpu_times()
                if self._ticks % CHILDREN_EVERY == 1:
                    gauges["children"] = float(len(self._process.children(recursive=True)))
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            self._process = None
            return None
        seconds = times.user + times.system + times.children_user + times.children_system
        return Sample(seconds, gauges, *signal_masks(self._process.pid))


def apply_sample(record: RankRecord, sample: Sample | None, now: float, interval: float) -> None:
    """Fold a sample into the record; CPU time that grew is evidence of the weak kind: progress
    only for a rank that has shown nothing stronger (``RankRecord.saw``)."""
    if sample is None:
        return
    if sample.cpu_seconds - record.cpu_seconds > IDLE_CPU_FRACTION * interval:
        record.saw(Evidence.CPU, now)
    record.cpu_seconds = sample.cpu_seconds
    record.gauges.update(sample.gauges)
    record.peak_rss_bytes = max(record.peak_rss_bytes, int(sample.gauges.get("rss", 0)))
    record.caught_mask, record.ignored_mask = sample.caught_mask, sample.ignored_mask


def apply_gpu(record: RankRecord, gpu: RankGpu, at: float) -> None:
    """Fold a rank's GPU sample into its record: the devices it ever held and its peak."""
    record.gpu, record.gpu_at = gpu, at
    for device in gpu.devices:
        if device.uuid not in record.gpu_uuids:
            record.gpu_uuids.append(device.uuid)
    if gpu.memory_bytes is not None:
        record.peak_gpu_memory_bytes = max(record.peak_gpu_memory_bytes or 0, gpu.memory_bytes)


SampleHandler = Callable[[list[tuple[RankRecord, Sample | None]]], None]


class GpuFold:
    """GPU passes into the rank records, then out as a ``GpuSampled`` event."""

    def __init__(self, records: Mapping[int, RankRecord],
                 emit: Callable[[GpuSampled], None]) -> None:
        self._records = records
        self._emit = emit
        self.devices: tuple[GpuDevice, ...] = ()  # this node's, at the last pass (snapshots)

    def __call__(self, gpu: GpuPass) -> None:
        at = time.time()
        self.devices = gpu.devices
        for each in gpu.ranks:
            record = self._records.get(each.rank)
            if record is not None and record.alive:
                apply_gpu(record, each, at)
        self._emit(GpuSampled(gpu.devices, gpu.ranks, at))


GpuHandler = Callable[[GpuPass], None]
Pairs = list[tuple[RankRecord, "RankSampler | None"]]
Results = tuple[list[tuple[RankRecord, Sample | None]], GpuPass | None]


class SamplingLoop:
    """Samples the live ranks every ``interval`` seconds in a worker thread: a process-tree
    walk never delays a stop. One pass at a time; a slow pass skips the next tick.

    With ``on_gpu``, the same pass reads the GPUs too (engine/gpu.py): NVML is opened on the
    first pass, in the worker; where there is none, ``gpu_state`` says "unavailable" and no
    pass asks again."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float,
                 live: Callable[[], list[RankRecord]], on_samples: SampleHandler,
                 on_gpu: GpuHandler | None = None, env: Mapping[str, str] | None = None) -> None:
        self._loop = loop
        self.interval = interval
        self._live = live
        self._on_samples = on_samples
        self._on_gpu = on_gpu
        self._env = env if env is not None else {}
        self.gpu: GpuSampler | None = None
        self.gpu_state = "untried" if on_gpu else "off"  # then "on" or "unavailable"
        self._samplers: dict[int, RankSampler] = {}
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None

    def add(self, record: RankRecord) -> None:
        if record.pid is not None:
            self._samplers[record.rank] = RankSampler(record.pid)

    def start(self) -> None:
        self._timer = self._loop.call_later(self.interval, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None

    def _tick(self) -> None:
        self.start()
        if self._busy:
            return
        self._busy = True
        pairs = [(r, self._samplers.get(r.rank)) for r in self._live()]
        future = self._loop.run_in_executor(None, self._pass, pairs)
        future.add_done_callback(self._sampled)

    def _pass(self, pairs: Pairs) -> Results:
        """In the worker thread: every rank's psutil sample, then the GPUs (never failing the
        psutil part)."""
        samples = [(r, s.sample() if s else None) for r, s in pairs]
        return samples, self.gpu_pass({r.pid: r.rank for r, _ in pairs if r.pid is not None})

    def gpu_pass(self, pids: Mapping[int, int]) -> GpuPass | None:
        if self.gpu_state == "untried":
            self.gpu = GpuSampler.open(self._env)
            self.gpu_state = "on" if self.gpu is not None else "unavailable"
        if self.gpu is None:
            return None
        try:
            return self.gpu.sample(pids)
        except Exception:  # NVML misbehaving beyond what gpu.py expects: skip this pass
            return None

    def _sampled(self, future: asyncio.Future[Results]) -> None:
        self._busy = False
        if self._timer is None or future.cancelled() or future.exception() is not None:
            return
        samples, gpu = future.result()
        self._on_samples(samples)
        if gpu is not None and self._on_gpu is not None:
            self._on_gpu(gpu)
