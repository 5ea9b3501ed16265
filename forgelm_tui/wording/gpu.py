"""GPU figures in words, for the headless lines and the summary (no rich, no textual here).

``gpu0 87% 30.0/80.0 GiB 61C 250 W``: a device's index (NVML's), utilisation, memory used of
total (the whole device), temperature and power when it offers them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from forgelm_tui.engine.events import GpuDevice, GpuSampled
from forgelm_tui.engine.records import RankRecord

GIB = float(1 << 30)
STATUS_EVERY = 30.0  # seconds between headless GPU lines while nothing moves


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f}"


def device_text(device: GpuDevice, *, brief: bool = False) -> str:
    """``gpu0 87% 30.0/80.0 GiB 61C 250 W``; brief, ``gpu0 87% 30/80G``, where a line has no
    room for every figure."""
    if device.lost:
        return f"gpu{device.index} lost"
    parts = [f"gpu{device.index}"]
    if device.utilization is not None:
        parts.append(f"{device.utilization:.0f}%")
    if device.memory_used is not None and device.memory_total:
        parts.append(f"{device.memory_used / GIB:.0f}/{device.memory_total / GIB:.0f}G" if brief
                     else f"{gib(device.memory_used)}/{gib(device.memory_total)} GiB")
    if brief:
        return " ".join(parts)
    if device.temperature is not None:
        parts.append(f"{device.temperature}C")
    if device.power_watts is not None:
        parts.append(f"{device.power_watts:.0f} W")
    return " ".join(parts)


def device_brief(device: GpuDevice) -> str:
    return device_text(device, brief=True)


def devices_line(devices: Sequence[GpuDevice], width: int) -> str:
    """Every device in ``width`` cells if it can be: all figures, else the brief form."""
    line = "  ·  ".join(device_text(d) for d in devices)
    if len(line) <= width:
        return line
    return " · ".join(device_brief(d) for d in devices)


def _ranks_on(index: int, event: GpuSampled) -> str:
    held = [f"rank {r.rank}" + (f" {gib(r.memory_bytes)} GiB" if r.memory_bytes is not None
                                else "")
            for r in event.ranks if any(d.index == index for d in r.devices)]
    return f" ({', '.join(held)})" if held else ""


def status_text(event: GpuSampled) -> str:
    """``gpu: gpu0 87% 30.0/80.0 GiB 61C 250 W (rank 0 20.0 GiB); gpu1 lost; no GPU: rank 2``"""
    parts = [device_text(d) + _ranks_on(d.index, event) for d in event.devices]
    idle = [str(r.rank) for r in event.ranks if not r.devices]
    if idle:
        parts.append(f"no GPU: rank{'s' if len(idle) > 1 else ''} {','.join(idle)}")
    return "gpu: " + "; ".join(parts)


class GpuStatus:
    """When ``--no-tui`` prints a GPU line: at the first sample, when a rank takes, leaves or
    changes a device or a device is lost, and every ``every`` seconds otherwise."""

    def __init__(self, every: float = STATUS_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._placement: Any = None
        self._last = 0.0
        self.index: dict[str, int] = {}  # device UUID -> index, for the summary

    def line(self, event: GpuSampled) -> str | None:
        for device in event.devices:
            self.index[device.uuid] = device.index
        placement = (tuple((r.rank, tuple(d.index for d in r.devices)) for r in event.ranks),
                     tuple(d.index for d in event.devices if d.lost))
        now = self._clock()
        if placement == self._placement and now - self._last < self._every:
            return None
        self._placement, self._last = placement, now
        return status_text(event)


def summary_cells(local: Iterable[RankRecord], remote: Sequence[Mapping[str, Any]],
                  index: Mapping[str, int]) -> dict[int, tuple[str, str]]:
    """Per rank the summary's ``gpu`` (devices held) and ``gpu peak`` cells; empty (no columns)
    when no rank was sampled on a GPU."""
    cells: dict[int, tuple[str, str]] = {}
    for record in local:
        if record.gpu is not None:
            cells[record.rank] = _cells(record.gpu_uuids, record.peak_gpu_memory_bytes, index)
    for rank in remote:
        gpu = rank.get("gpu")
        if isinstance(gpu, dict):
            cells[rank["rank"]] = _cells(gpu.get("devices") or [], gpu.get("peak_memory_bytes"),
                                         index)
    return cells


def _cells(uuids: Sequence[str], peak: int | None,
           index: Mapping[str, int]) -> tuple[str, str]:
    names = [str(index[u]) if u in index else u[:12] for u in uuids]
    return (",".join(names) or "-", "-" if peak is None else f"{gib(peak)} GiB")
