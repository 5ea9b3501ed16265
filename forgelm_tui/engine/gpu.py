"""GPU sampling on NVML (nvidia-ml-py's ``pynvml``), imported lazily and only here.

No library, no driver, no GPU: :func:`open_nvml` fails once, quietly, and nothing else happens
(no line, no thread, no cost). Otherwise every sample pass (in the psutil sampler's worker, at
its cadence) reads each device's utilisation, memory, temperature and power, and which processes
hold it; a process is a rank's when it is the rank's main process or a descendant, found by
walking up its parents once and remembered (a process tree per pass costs too much). A device
that NVML says is lost (GpuIsLost, Unknown) is marked lost and the pass goes on without it;
a figure the device does not offer (NotSupported) is absent and never asked for again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil

from forgelm_tui.engine.gpu_events import GpuDevice, RankGpu
from forgelm_tui.engine.gpu_visible import VISIBLE_ENV, visible_count, visible_indices

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
LOST_CODES = frozenset({15, 999})  # NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
PARENT_WALK = 64  # ancestors looked at before a process counts as no rank's

_lock = threading.Lock()
_opened: list[ModuleType | None] = []  # one nvmlInit a process, whatever its outcome


def open_nvml() -> ModuleType | None:
    """``pynvml`` initialised, or None when there is no NVML here (tried once a process)."""
    with _lock:
        if not _opened:
            _opened.append(_init())
        return _opened[0]


def _init() -> ModuleType | None:
    try:
        import pynvml  # lazily: most machines have no GPU

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
    except Exception:  # no module, no library, no driver: no GPU sampling, and no word of it
        return None
    module: ModuleType = pynvml
    return module


def _uuid(nvml: ModuleType, handle: Any) -> str:
    uuid = nvml.nvmlDeviceGetUUID(handle)
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def visible_gpu_count(env: Mapping[str, str]) -> int:
    """GPUs a rank would see (``--nproc-per-node gpu``): NVML's devices as CUDA_VISIBLE_DEVICES
    filters them, 0 without NVML."""
    nvml = open_nvml()
    if nvml is None:
        return 0
    try:
        uuids = [_uuid(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(nvml.nvmlDeviceGetCount())]
    except Exception:
        return 0
    return visible_count(env.get(VISIBLE_ENV), uuids)


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except (psutil.Error, ValueError):
        return None


class PidOwners:
    """Which rank a process belongs to, remembered: each new pid's parents are walked once."""

    def __init__(self, parent: Callable[[int], int | None] = _parent) -> None:
        self._parent = parent
        self._known: dict[int, int | None] = {}

    def owner(self, pid: int, ranks: Mapping[int, int]) -> int | None:
        """The rank whose main process is ``pid`` or one of its ancestors (``ranks``: pid ->
        rank)."""
        if pid in ranks:
            return ranks[pid]
        if pid in self._known:
            return self._known[pid]
        chain, found, current = [pid], None, pid
        for _ in range(PARENT_WALK):
            parent = self._parent(current)
            if parent is None or parent <= 1:
                break
            if parent in ranks:
                found = ranks[parent]
                break
            if parent in self._known:
                found = self._known[parent]
                break
            chain.append(parent)
            current = parent
        for each in chain:
            self._known[each] = found
        return found

    def keep_only(self, pids: set[int]) -> None:
        """Forget processes NVML no longer lists (a pid may be reused)."""
        for pid in [p for p in self._known if p not in pids]:
            del self._known[pid]


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)  # figures it does not offer


@dataclass(frozen=True)
class GpuPass:
    """One pass: every device's figures, and each live rank's devices and memory."""

    devices: tuple[GpuDevice, ...]
    ranks: tuple[RankGpu, ...]


class GpuSampler:
    """Reads NVML for a sample pass; made by :meth:`open`, used from one thread at a time."""

    def __init__(self, nvml: ModuleType, devices: list[_Device], visible: set[int],
                 owners: PidOwners | None = None) -> None:
        self._nvml = nvml
        self._devices = devices
        self._visible = visible  # shown in the header even while no rank holds them
        self._owners = owners or PidOwners()
        self._holders: dict[int, dict[int, int | None]] = {}  # the last pass's, per device

    @classmethod
    def open(cls, env: Mapping[str, str], owners: PidOwners | None = None) -> GpuSampler | None:
        nvml = open_nvml()
        if nvml is None:
            return None
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception:
            return None
        devices = [_open_device(nvml, index) for index in range(count)]
        shown = visible_indices(env.get(VISIBLE_ENV), [d.uuid for d in devices])
        visible = set(shown) if isinstance(shown, list) else {d.index for d in devices}
        return cls(nvml, devices, visible, owners)

    def sample(self, ranks: Mapping[int, int]) -> GpuPass:
        """``ranks``: each live rank's main pid -> its rank. A lost device keeps the ranks it
        had when it was lost (shown on it, as lost)."""
        by_device: dict[int, dict[int, int | None]] = {}  # device -> rank -> its memory
        listed: set[int] = set()
        for device in self._devices:
            found = self._processes(device)
            if device.lost:
                by_device[device.index] = self._holders.get(device.index, {})
                continue
            on: dict[int, int | None] = {}
            for pid, used in found:
                listed.add(pid)
                rank = self._owners.owner(pid, ranks)
                if rank is not None:
                    before = on.get(rank)
                    on[rank] = used if before is None else before + (used or 0)
            by_device[device.index] = on
        self._owners.keep_only(listed)
        self._holders = by_device
        held: dict[int, dict[int, int | None]] = {}  # rank -> device -> its memory
        for index, on in by_device.items():
            for rank, used in on.items():
                held.setdefault(rank, {})[index] = used
        shown = {d.index: self._figures(d) for d in self._devices
                 if d.index in self._visible or any(d.index in h for h in held.values())}
        return GpuPass(tuple(shown.values()),
                       tuple(_rank_gpu(rank, held.get(rank, {}), shown)
                             for rank in sorted(ranks.values())))

    def _processes(self, device: _Device) -> list[tuple[int, int | None]]:
        out: list[tuple[int, int | None]] = []
        for read in (self._nvml.nvmlDeviceGetComputeRunningProcesses,
                     self._nvml.nvmlDeviceGetGraphicsRunningProcesses):
            found = self._read(device, read.__name__, read)
            for proc in found or ():
                used = getattr(proc, "usedGpuMemory", None)
                out.append((int(proc.pid), int(used) if isinstance(used, int) else None))
        return out

    def _read(self, device: _Device, what: str, read: Callable[..., Any], *args: Any) -> Any:
        """One NVML figure, or None: lost devices and figures not offered are not asked."""
        if device.lost or what in device.unsupported:
            return None
        try:
            return read(device.handle, *args)
        except Exception as exc:
            code = _code(exc)
            if code == NOT_SUPPORTED:
                device.unsupported.add(what)
            elif code in LOST_CODES:
                device.lost = True
            return None

    def _memory(self, device: _Device) -> Any:
        """Memory as nvidia-smi counts it (v2: without the driver's reservation) where the
        driver offers it, else v1."""
        v2 = getattr(self._nvml, "nvmlMemory_v2", None)
        if v2 is not None and "memory_v2" not in device.unsupported and not device.lost:
            try:
                return self._nvml.nvmlDeviceGetMemoryInfo(device.handle, version=v2)
            except Exception as exc:
                if _code(exc) in LOST_CODES:
                    device.lost = True
                    return None
                device.unsupported.add("memory_v2")  # an older driver: v1 from now on
        return self._read(device, "memory", self._nvml.nvmlDeviceGetMemoryInfo)

    def _figures(self, device: _Device) -> GpuDevice:
        nvml = self._nvml
        rates = self._read(device, "utilization", nvml.nvmlDeviceGetUtilizationRates)
        memory = self._memory(device)
        temperature = self._read(device, "temperature", nvml.nvmlDeviceGetTemperature,
                                 TEMPERATURE_GPU)
        power = self._read(device, "power", nvml.nvmlDeviceGetPowerUsage)
        return GpuDevice(
            index=device.index, uuid=device.uuid, name=device.name,
            utilization=None if rates is None else float(rates.gpu),
            memory_used=None if memory is None else int(memory.used),
            memory_total=None if memory is None else int(memory.total),
            temperature=None if temperature is None else int(temperature),
            power_watts=None if power is None else round(power / 1000.0, 1),
            lost=device.lost)


def _open_device(nvml: ModuleType, index: int) -> _Device:
    """A device as NVML names it; one that fails already is lost (the others are sampled)."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        return _Device(index, handle, _uuid(nvml, handle),
                       name.decode() if isinstance(name, bytes) else str(name))
    except Exception:
        return _Device(index, None, f"unknown-{index}", "?", lost=True)


def _rank_gpu(rank: int, held: dict[int, int | None], shown: dict[int, GpuDevice]) -> RankGpu:
    known = [m for m in held.values() if m is not None]
    return RankGpu(rank, tuple(shown[i] for i in sorted(held) if i in shown),
                   sum(known) if known else None)
