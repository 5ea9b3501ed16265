"""GPU samples for the scripted TUI runs (tests/scripted.py): 8 ranks on 8 devices, rank 3 at
79.6 of 80 GiB. The GPU snapshot tests and screenshots/make.py (gpus.svg) start from here."""

from __future__ import annotations

from typing import Any

from scripted import ScriptedRun, scripted_app
from textual.pilot import Pilot

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import GpuDevice, RankGpu

GIB = 1 << 30
T = 1_796_040_100.0


def devices(count: int = 8, **changes: Any) -> list[GpuDevice]:
    out = []
    for index in range(count):
        fields: dict[str, Any] = dict(
            index=index, uuid=f"GPU-{index:08x}-fake", name="NVIDIA H100 80GB HBM3",
            utilization=float(97 - 3 * index), memory_used=(40 + 5 * index) * GIB,
            memory_total=80 * GIB, temperature=55 + index, power_watts=300.0 + 20 * index)
        fields.update(changes.get(f"d{index}", {}))
        out.append(GpuDevice(**fields))
    return out


def sample(shown: list[GpuDevice], placement: dict[int, int | None],
           memory: dict[int, int]) -> ev.GpuSampled:
    ranks = tuple(RankGpu(rank, () if on is None else (shown[on],),
                          None if on is None else memory.get(rank, 30 * GIB))
                  for rank, on in sorted(placement.items()))
    return ev.GpuSampled(tuple(shown), ranks, T)


RUNNING = {rank: rank for rank in range(8)}
MEMORY = {rank: (30 + 4 * rank) * GIB for rank in range(8)} | {3: int(79.6 * GIB)}


def gpu_app(*samples: ev.GpuSampled) -> tuple[Any, ScriptedRun, Any]:
    app, run, prepare = scripted_app("running")

    async def prepare_gpus(pilot: Pilot[Any]) -> None:
        await prepare(pilot)
        run.emit(*samples)
        app.refresh_table()
        await pilot.pause()

    return app, run, prepare_gpus
