"""Ranks grouped by node: the rank table of a run with more ranks than the screen has rows.

A multi-node run whose ranks outnumber the terminal's rows (16 nodes x 8 GPUs on an 80x24
terminal) shows one row per node: its ranks' states counted, its slowest rank's step and how
long its longest-waiting live rank has gone without one, its worst output age, its GPUs, as
that node sums them up (engine/node_summary.py; a node no view opened sends only that and its
ranks that need reading: cluster/views.py). A node row opens (enter, or a click) to its ranks'
rows. A rank that needs reading shows under its node whether the node is open or not: the
verdict's root cause, a rank the stall rule named, one the ended run's hang names as never
having entered the collective the others wait in (on any node), one that failed on its own
(not after a stop signalled it: that is the stop's collateral, and a stop signals every rank)
or that died of a signal forgelm-tui did not send. The verdict panel, the log and its search
still cover every rank. README.md ("Many ranks").

Pure functions of the model (no Textual); tui/widgets/rank_table.py lays the rows out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from forgelm_tui.engine.events import RankState
from forgelm_tui.engine.node_summary import NodeSummary, RankFacts, summarise
from forgelm_tui.signames import signal_name
from forgelm_tui.tui.model import RankRow, RunModel, exit_words
from forgelm_tui.tui.units import human_seconds
from forgelm_tui.tui.widgets.gpu_cells import memory_cell
from forgelm_tui.tui.widgets.progress_bar import fraction_cell

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
    if row.rank in model.stalled or row.rank in model.hang_missing:
        return True
    stopped = [sig for sig, purpose, _ in row.sent if purpose.stops]
    if row.signal is not None and row.signal not in {sig for sig, _, _ in row.sent}:
        return True
    return row.state in (RankState.FAILED, RankState.KILLED) and not stopped


def facts(model: RunModel, row: RankRow) -> RankFacts:
    """A rank of this view's rows as its node's row counts it (engine/node_summary.py)."""
    live = row.ended_at is None and row.pid is not None
    now = model.clock()
    stop = next((sig for sig, purpose, _ in reversed(row.sent) if purpose.stops), None)
    return RankFacts(
        row.rank, row.state, live, row.step, row.total,
        step_age=now - row.history.marks[-1][0] if live and row.history.marks else None,
        output_age=model.output_age(row) if live else None, exit_code=row.exit_code,
        stop_signal=stop, gpu=model.gpu.ranks.get(row.rank))


@dataclass
class NodeView:
    """One node's row as its cells read it."""

    model: RunModel
    node: int
    rows: list[RankRow]  # its ranks, by rank (as far as this view has them)
    opened: bool

    @functools.cached_property
    def summary(self) -> NodeSummary:
        """Another node's ranks summed up by that node (grown by the time since this view got
        it): its rows here may be only those that need reading. This node's, from its rows."""
        got = self.model.summaries.get(self.node)
        if self.node != self.model.node_rank and got is not None:
            summary, at = got
            return summary.aged(self.model.clock() - at)
        return summarise(facts(self.model, r) for r in self.rows)

    @functools.cached_property
    def gpu(self) -> dict[str, Cell]:
        """Its devices counted, their mean GPU %, the fullest rank's memory (each cell once)."""
        summary = self.summary
        memory = summary.gpu_memory
        return {"gpu": (str(summary.gpus) if summary.gpus else "-", ""),
                "gpu_util": (f"{summary.gpu_util:5.1f}" if summary.gpu_util is not None else "-",
                             ""),
                "gpu_mem": memory_cell(memory[1], memory[2], memory[3]) if memory else ("-", "")}


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
    summary = view.summary
    present = [s for s in WORST_FIRST if summary.count(s)]
    if len(present) == 1:
        return (f"{summary.count(present[0])} {present[0].value}",
                styles.get(present[0].value, ""))
    text = " ".join(f"{summary.count(s)} {SHORT[s]}" for s in reversed(present))
    return (text, styles.get(present[0].value, "") if present else "")


def bar_of(view: NodeView) -> Cell:
    """The slowest rank's step of its total, for the progress bar column."""
    slowest = view.summary.slowest
    return ("", "") if slowest is None else fraction_cell(slowest[1], slowest[2], "")


def progress_text(view: NodeView) -> str:
    """``40/100 ·12s``: the slowest rank's step, then the longest wait for a step."""
    slowest = view.summary.slowest
    if slowest is None:
        return ""
    _, step, total = slowest
    core = f"{step}/{total}" if total else str(step)
    wait = view.summary.step_wait
    return f"{core} ·{human_seconds(wait)}" if wait is not None and wait >= 1 else core


def output_age(view: NodeView) -> Cell:
    return (human_seconds(view.summary.output_age), "")


def exit_cell(view: NodeView) -> Cell:
    """The first failing rank's exit; ``0 SUCCESS`` once every rank exited 0."""
    code = view.summary.exit_code
    if code is None:
        return ("", "")
    return (exit_words(code), "bold red" if code else "cyan")


def signal_cell(view: NodeView) -> Cell:
    """``SIGTERM ×8``: the stop signal its ranks were sent last, and to how many."""
    sent = view.summary.stop_signal
    if sent is None:
        return ("", "")
    sig, count = sent
    return (f"{signal_name(sig)} ×{count}", "magenta")
