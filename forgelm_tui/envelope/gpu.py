"""The envelope's GPU fields (docs/envelope.md): each rank's devices and peak memory, and a
rank's last GPU sample (the root cause's). Null where there was no GPU sampling."""

from __future__ import annotations

from typing import Any

from forgelm_tui.engine.events import GpuDevice
from forgelm_tui.engine.records import RankRecord
from forgelm_tui.isotime import iso


def rank_gpu(record: RankRecord) -> dict[str, Any] | None:
    """``ranks[].gpu``: every device its processes held (UUIDs, first seen first) and the most
    GPU memory they held at once."""
    if record.gpu is None:
        return None
    return {"devices": list(record.gpu_uuids),
            "peak_memory_bytes": record.peak_gpu_memory_bytes}


def device_dict(device: GpuDevice) -> dict[str, Any]:
    return {"index": device.index, "uuid": device.uuid, "name": device.name,
            "utilization_percent": device.utilization,
            "memory_used_bytes": device.memory_used, "memory_total_bytes": device.memory_total,
            "temperature_c": device.temperature, "power_w": device.power_watts,
            "lost": device.lost}


def last_gpu_sample(record: RankRecord | None) -> dict[str, Any] | None:
    """A rank's last GPU sample: when, what its processes held, and its devices' figures."""
    if record is None or record.gpu is None:
        return None
    return {"rank": record.rank, "at": iso(record.gpu_at),
            "memory_bytes": record.gpu.memory_bytes,
            "devices": [device_dict(d) for d in record.gpu.devices]}
