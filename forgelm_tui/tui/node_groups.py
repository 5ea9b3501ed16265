"""Ranks grouped by node: the rank table of a run with more ranks than the screen has rows.

A multi-node run whose ranks outnumber the terminal's rows (16 nodes x 8 GPUs on an 80x24
terminal) shows one row per node: its ranks' states counted, its slowest rank's step and how
long its longest-waiting live rank has gone without one, its worst output age, its GPUs. A node
row opens (enter, or a click) to its ranks' rows. A rank that needs reading shows under its node
whether the node is open or not: the verdict's root cause, a rank the stall rule named, one that
failed on its own (not after a stop signalled it: that is the stop's collateral, and a stop
signals every rank) or that died of a signal forgelm-tui did not send. The verdict panel, the
log and its search still cover every rank. docs/tui.md ("Many ranks").

Pure functions of the model (no Textual); tui/widgets/rank_table.py lays the rows out.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from forgelm_tui.engine.events import RankState
from forgelm_tui.signames import signal_name
from forgelm_tui.tui.model import RankRow, RunModel
from forgelm_tui.tui.units import human_seconds
from forgelm_tui.tui.widgets.gpu_cells import gpu_cells

Cell = tuple[str, str]  # (plain text, style)

# The states as a node row counts them, the one that most needs reading first (its style wins).
WORST_FIRST = (RankState.FAILED, RankState.KILLED, RankState.STOPPING, RankState.QUIET,
               RankState.STARTING, RankState.RUNNING, RankState.EXITED)
SHORT = {RankState.FAILED: "fail", RankState.KILLED: "kill", RankState.STOPPING: "stop",
         RankState.QUIET: "quiet", RankState.STARTING: "start", RankState.RUNNING: "run",
         RankState.EXITED: "exit"}


def node_of(model: RunModel, row: RankRow) -> int:
    return model.node_rank if row.node_rank is None else row.node_rank


def grouped(model: RunModel, screen_rows: int) -> bool:
    """Group by node: a multi-node run with more ranks than the screen has rows."""
    return model.nnodes > 1 and screen_rows > 0 and len(model.ranks) > screen_rows


def notable(model: RunModel, row: RankRow) -> bool:
    """A rank shown under its node even when the node is closed (the module's docstring)."""
    if model.verdict is not None and model.verdict.verdict.root_cause_rank == row.rank:
        return True
    if row.rank in model.stalled:
        return True
    stopped = [sig for sig, purpose, _ in row.sent if purpose.stops]
    if row.signal is not None and row.signal not in {sig for sig, _, _ in row.sent}:
        return True
    return row.state in (RankState.FAILED, RankState.KILLED) and not stopped


@dataclass
class NodeView:
    """One node's row as its cells read it."""

    model: RunModel
    node: int
    rows: list[RankRow]  # its ranks, by rank
    opened: bool

    @property
    def live(self) -> list[RankRow]:
        return [r for r in self.rows if r.ended_at is None and r.pid is not None]

    def slowest(self) -> RankRow | None:
        stepped = [r for r in self.rows if r.step is not None]
        return min(stepped, key=lambda r: (r.step, r.rank)) if stepped else None

    def step_wait(self) -> float | None:
        """The longest a live rank of the node has gone without a new step (wall clock)."""
        now = self.model.clock()
        waits = [now - r.history.marks[-1][0] for r in self.live if r.history.marks]
        return max(waits) if waits else None

    @functools.cached_property
    def gpu(self) -> dict[str, Cell]:
        """Its devices counted, their mean GPU %, the fullest rank's memory (each cell once)."""
        ranks = self.model.gpu.ranks
        devices = {d.index for r in self.rows if (g := ranks.get(r.rank)) for d in g.devices}
        utils = [d.utilization for r in self.live if (g := ranks.get(r.rank))
                 for d in g.devices if d.utilization is not None]
        fullest = max(((g.memory_bytes or 0, r.rank) for r in self.rows
                       if (g := ranks.get(r.rank))), default=None)
        memory = gpu_cells(self.model.gpu, fullest[1], True)["gpu_mem"] if fullest else ("-", "")
        return {"gpu": (str(len(devices)) if devices else "-", ""),
                "gpu_util": (f"{sum(utils) / len(utils):5.1f}" if utils else "-", ""),
                "gpu_mem": memory}

    def output_age(self) -> float | None:
        found = [age for r in self.live if (age := self.model.output_age(r)) is not None]
        return max(found) if found else None


def group_rows(model: RunModel, opened: set[int]) -> list[tuple[NodeView, list[RankRow]]]:
    """Each node's view and the rank rows shown under it, by node."""
    nodes: dict[int, list[RankRow]] = {}
    for rank in sorted(model.ranks):
        row = model.ranks[rank]
        nodes.setdefault(node_of(model, row), []).append(row)
    return [(NodeView(model, node, rows, node in opened),
             rows if node in opened else [r for r in rows if notable(model, r)])
            for node, rows in sorted(nodes.items())]


def state_cell(view: NodeView, styles: dict[str, str]) -> Cell:
    """``8 run`` or ``6 run 2 fail``: the node's ranks by state, the worst state's style."""
    counts = Counter(r.state for r in view.rows)
    present = [s for s in WORST_FIRST if counts[s]]
    if len(present) == 1:
        return (f"{counts[present[0]]} {present[0].value}", styles.get(present[0].value, ""))
    text = " ".join(f"{counts[s]} {SHORT[s]}" for s in reversed(present))
    return (text, styles.get(present[0].value, "") if present else "")


def progress_text(view: NodeView) -> str:
    """``40/100 ·12s``: the slowest rank's step, then the longest wait for a step."""
    slowest = view.slowest()
    if slowest is None:
        return ""
    core = slowest.progress_text().split(" ", 1)[0]
    wait = view.step_wait()
    return f"{core} ·{human_seconds(wait)}" if wait is not None and wait >= 1 else core


def exit_cell(view: NodeView) -> Cell:
    """The first failing rank's exit; ``0 SUCCESS`` once every rank exited 0."""
    ended = [r for r in view.rows if r.exit_code is not None]
    failed = [r for r in ended if r.exit_code != 0]
    if failed:
        return (failed[0].exit_text(), "bold red")
    if ended and len(ended) == len(view.rows):
        return (ended[0].exit_text(), "cyan")
    return ("", "")


def signal_cell(view: NodeView) -> Cell:
    """``SIGTERM ×8``: the stop signal its ranks were sent last, and to how many."""
    last = [next((sig for sig, purpose, _ in reversed(r.sent) if purpose.stops), None)
            for r in view.rows]
    sent = Counter(sig for sig in last if sig is not None)
    if not sent:
        return ("", "")
    sig, count = sent.most_common(1)[0]
    return (f"{signal_name(sig)} ×{count}", "magenta")
