"""The rank table's GPU columns: device, GPU % and GPU memory (a bar), shown only once a GPU
sample came (``GpuView.seen``): on a machine without NVML the table is as it always was.

Memory is the rank's own (its processes, as NVML counts them) of its devices' total; the bar
turns yellow past 80 % and red past 95 %: how close the rank is to running out. Where NVML
does not give per-process memory, the device's used memory stands in.
"""

from __future__ import annotations

from forgelm_tui.engine.events import RankGpu
from forgelm_tui.engine.node_summary import memory_of
from forgelm_tui.tui.gpu_view import GpuView
from forgelm_tui.tui.widgets.progress_bar import blocks
from forgelm_tui.wording.gpu import GIB

# (key, label, starting width): "0,1" devices, "100.0", "▉▉▉▉▉ 79.6/80.0G"
GPU_COLUMNS = (("gpu", "GPU", 3), ("gpu_util", "GPU %", 5), ("gpu_mem", "GPU mem", 16))
BAR_CELLS = 5

Cell = tuple[str, str]


def bar(fraction: float, cells: int = BAR_CELLS) -> str:
    """``fraction`` of ``cells`` cells in block characters, to an eighth of a cell."""
    return blocks(fraction, cells, empty="·")


def _memory_cell(gpu: RankGpu, active: bool) -> Cell:
    used, total = memory_of(gpu)
    if used is None or not total:
        return ("-", "")
    return memory_cell(used, total, active)


def memory_cell(used: int, total: int, active: bool) -> Cell:
    """``▉▉▉▉▉ 79.6/80.0G``, yellow past 80 %, red past 95 %; dimmed once it ended."""
    fraction = used / total
    style = "red" if fraction > 0.95 else "yellow" if fraction > 0.8 else "green"
    text = f"{bar(fraction)} {used / GIB:.1f}/{total / GIB:.1f}G"
    return (text, style if active else "dim")


def gpu_cells(view: GpuView, rank: int, active: bool) -> dict[str, Cell]:
    """The rank's GPU cells; ``active``: the rank still runs (an ended rank keeps its device
    and last memory, dimmed; its GPU % goes)."""
    gpu = view.ranks.get(rank)
    if gpu is None or not gpu.devices:
        return {"gpu": ("-", ""), "gpu_util": ("-", ""), "gpu_mem": ("-", "")}
    if any(d.lost for d in gpu.devices):
        lost = ",".join(str(d.index) for d in gpu.devices if d.lost)
        return {"gpu": (f"{lost} lost", "bold red"), "gpu_util": ("-", ""),
                "gpu_mem": _memory_cell(gpu, active)}
    utils = [d.utilization for d in gpu.devices if d.utilization is not None]
    util = f"{max(utils):5.1f}" if utils and active else "-"
    return {"gpu": (",".join(str(d.index) for d in gpu.devices), "" if active else "dim"),
            "gpu_util": (util, ""), "gpu_mem": _memory_cell(gpu, active)}
