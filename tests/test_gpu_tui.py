"""The TUI with GPU samples (a scripted run): device, GPU % and GPU memory columns, a header
line per device, a moved rank on its new device, a lost device; snapshots of the table with GPU
columns. Without GPU samples the table and header are as they always were (the other
snapshots in tests/__snapshots__ stay identical)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scripted import scripted_app
from scripted_gpu import GIB, MEMORY, RUNNING, T, devices, gpu_app, sample
from test_tui_small import region_text

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import RankGpu
from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.widgets.gpu_cells import bar
from forgelm_tui.tui.widgets.rank_table import RankTable
from forgelm_tui.tui.widgets.run_header import RunHeader

pytestmark = pytest.mark.timeout(60)
SIZE = (170, 42)


def cell(table: RankTable, rank: int, key: str) -> str:
    return str(table.get_cell(str(rank), key))


async def test_gpu_columns_header_line_a_moved_rank_and_a_lost_device() -> None:
    app, run, prepare = gpu_app(sample(devices(), RUNNING, MEMORY))
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        table = app.query_one(RankTable)
        assert {"gpu", "gpu_util", "gpu_mem"} <= set(table.shown_widths)
        assert cell(table, 3, "gpu") == "3" and cell(table, 3, "gpu_util") == " 88.0"
        assert cell(table, 3, "gpu_mem") == "█████ 79.6/80.0G"
        assert cell(table, 0, "gpu_mem") == "█▉··· 30.0/80.0G"
        header = region_text(app, app.query_one(RunHeader))
        assert len(header) == 3
        assert header[2].strip().startswith("gpu0 97% 40/80G · gpu1 94% 45/80G · gpu2")
        # A rank moved to another device, one left its device, a device was lost.
        lost = devices(d7={"lost": True, "utilization": None, "memory_used": None})
        run.emit(sample(lost, RUNNING | {1: 0, 2: None}, MEMORY))
        app.refresh_table()
        await pilot.pause()
        assert cell(table, 1, "gpu") == "0"
        assert cell(table, 2, "gpu") == "-" and cell(table, 2, "gpu_mem") == "-"
        assert cell(table, 7, "gpu") == "7 lost"
        assert "gpu7 lost" in region_text(app, app.query_one(RunHeader))[2]


async def test_without_gpu_samples_there_are_no_gpu_columns() -> None:
    app, _, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        assert not {"gpu", "gpu_util", "gpu_mem"} & set(app.query_one(RankTable).shown_widths)
        assert len(region_text(app, app.query_one(RunHeader))) == 2


def test_a_late_viewer_sees_the_gpus_from_the_snapshot() -> None:
    shown = devices(2)
    gpu = RankGpu(1, (shown[1],), 5 * GIB)
    seen = RunModel("r", ["x"], 2)
    seen.apply(ev.GpuSampled(tuple(shown), (gpu,), T))
    late = RunModel("r", ["x"], 2)
    snap = ev.RankSnapshot(1, 1, 0, 42, ev.RankState.RUNNING, T, None, None, None, (), "", None,
                           None, None, {}, None, {}, gpu=gpu)
    late.restore(ev.RunSnapshot("r", 2, ("x",), "/r", T, (snap,), gpus=tuple(shown)))
    assert (late.gpu.devices, late.gpu.ranks, late.gpu.seen) == (
        seen.gpu.devices, seen.gpu.ranks, True)


def test_the_bar() -> None:
    assert bar(0.0) == "·····" and bar(1.0) == "█████" and bar(0.5) == "██▌··"
    assert bar(2.0) == "█████" and bar(-1.0) == "·····"


def _snap(snap_compare: Any, *samples: ev.GpuSampled, size: tuple[int, int] = SIZE) -> None:
    app, _, prepare = gpu_app(*samples)
    assert snap_compare(app, terminal_size=size, run_before=prepare)


def test_snapshot_gpus(snap_compare: Any, tmp_path: Path) -> None:
    _snap(snap_compare, sample(devices(), RUNNING, MEMORY))


def test_snapshot_gpus_80x24(snap_compare: Any, tmp_path: Path) -> None:
    lost = devices(d7={"lost": True, "utilization": None, "memory_used": None})
    _snap(snap_compare, sample(lost, RUNNING | {1: 0}, MEMORY), size=(80, 24))
