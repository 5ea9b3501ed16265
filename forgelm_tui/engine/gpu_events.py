"""GPU sample events (engine/gpu.py makes them), kept apart from events.py, which re-exports
them: plain frozen data, through JSON and back like every event (engine/codec.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML showed it at a sample; a figure it does not offer is None."""

    index: int  # NVML's index on its node (not the CUDA ordinal a rank sees)
    uuid: str
    name: str
    utilization: float | None  # percent of the last sample period the GPU was busy
    memory_used: int | None  # bytes, every process on it
    memory_total: int | None
    temperature: int | None = None  # degrees C
    power_watts: float | None = None
    lost: bool = False  # NVML said it is lost (GpuIsLost, Unknown): no figures from then on


@dataclass(frozen=True)
class RankGpu:
    """The devices a rank's processes (it and its descendants) hold, with their figures."""

    rank: int
    devices: tuple[GpuDevice, ...]  # none: it holds no GPU (yet, or any more)
    memory_bytes: int | None  # what its processes use on them; None: NVML does not say


@dataclass(frozen=True)
class GpuSampled:
    """A GPU sample pass (engine/gpu.py): this node's devices and every live rank's."""

    devices: tuple[GpuDevice, ...]
    ranks: tuple[RankGpu, ...]
    at: float
