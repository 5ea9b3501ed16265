"""The rank table: one row per rank, only changed cells repainted, at most twice a second.

The table never scrolls sideways. Each column wants the width of the widest value it has held
(at least its starting width: a pid, RSS, uptime... so the first samples of a run widen
nothing); when they do not all fit, columns give way in a fixed order (``GIVE_WAY``): the last
line shrinks, CPU, RSS, kids and uptime hide, then local rank and pid, progress keeps only its
step/total... Rank, state, exit and signal always show. A cell wider than its column is clipped
with an ellipsis, never cut silently: a silently cut ``40/100`` reads ``40/10``.

A new layout (a resize, a scrollbar, a column that needs more room) rebuilds the table once: a
layout pass of the whole screen (25-50 ms here), rare. Otherwise only changed cells update.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.text import Text
from textual.widgets import DataTable

from forgelm_tui.engine.events import ProgressEvidence
from forgelm_tui.engine.node_summary import Watch
from forgelm_tui.tui import node_groups as groups
from forgelm_tui.tui.model import RankRow, RunModel
from forgelm_tui.tui.node_groups import NodeView
from forgelm_tui.tui.units import human_bytes, human_seconds
from forgelm_tui.tui.widgets.gpu_cells import GPU_COLUMNS, gpu_cells
from forgelm_tui.tui.widgets.progress_bar import BAR_CELLS, bar_cell, fit_bar

LAST_LINE_CHARS = 40  # the log pane has the whole line; the table only a glimpse

CORE = -1  # a progress floor: its step/total, never clipped ("40/100" of "40/100 loss 2.2")
# How columns give way when the table is too narrow, in this order: (key, floor) shrinks the
# column down to ``floor`` cells at most, (key, None) hides it. What a later step frees goes back
# to the columns that shrank. Not listed: rank and state, always shown whole.
GIVE_WAY: tuple[tuple[str, int | None], ...] = (
    ("last", 24), ("bar", 6), ("signal", 24),
    ("cpu", None), ("rss", None), ("children", None), ("uptime", None), ("bar", None),
    ("gpu_util", None),
    ("local", None), ("pid", None), ("node", None), ("last", 12), ("progress", CORE),
    ("signal", 18),
    ("age", None), ("last", None), ("gpu_mem", None), ("gpu", None),
    ("signal", 8), ("exit", 6), ("progress", None),
)
NUMBER = "0123456789.,/:+-eE%"  # the characters a number is written with (for a cut)
CELL_PADDING = 1  # DataTable's: each column takes its width plus a blank on either side

STATE_STYLES = {
    "starting": "dim",
    "running": "green",
    "quiet": "yellow",
    "stopping": "bold magenta",
    "exited": "cyan",
    "failed": "bold red",
    "killed": "red",
}

Cell = tuple[str, str]  # (plain text, style)


def _clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells; a cut shows as an ellipsis, never silently, and
    never inside a number: ``40/100 loss 2.153`` is ``40/100 loss …``, not ``40/100 loss 2.1…``."""
    if cell_len(text) <= width:
        return text
    if width <= 0:
        return ""
    head = set_cell_size(text, width - 1)
    if len(head) == cell_len(head) and text[len(head)] in NUMBER and head[-1:] in NUMBER:
        head = head.rstrip(NUMBER)
    return head + "…"


def _clip_progress(text: str, width: int) -> str:
    """Progress keeps its step/total whole when the metric does not fit: ``40/100``."""
    core = text.split(" ", 1)[0]
    if cell_len(core) <= width < cell_len(text) and width < cell_len(core) + 3:
        return core
    return _clip(text, width)


def progress_cell(row: RankRow) -> Cell:
    """A rank's steps; for a rank that reports none, what its progress is judged by, dimmed:
    ``output`` (it prints) or ``cpu`` (only its CPU time; docs/progress.md). A rank that
    reports steps shows them alone: only a step or a heartbeat is its progress."""
    text = row.progress_text()
    if row.evidence is None or row.evidence is ProgressEvidence.STEPS:
        return (text, "")
    if not text:
        return (row.evidence.value, "dim")
    return (f"{text} · {row.evidence.value}", "")


class RowView:
    """One row as its cells read it: the rank's row, the run's model, what several cells share."""

    def __init__(self, model: RunModel, row: RankRow) -> None:
        self.model, self.row = model, row
        self.style = STATE_STYLES.get(row.state.value, "")
        self.active = row.ended_at is None and row.pid is not None

    @functools.cached_property
    def gpu(self) -> dict[str, Cell]:
        return gpu_cells(self.model.gpu, self.row.rank, self.active)


@dataclass(frozen=True)
class Column:
    """A rank-table column, declared once: its key, header, starting width (a pid, RSS, uptime...
    so the first samples of a run widen nothing), the widest it grows to (wider values are
    clipped), how a value is fitted to its width, its cell, and when it shows at all."""

    key: str
    label: str
    width: int
    cell: Callable[[RowView], Cell]
    widest: int = 1 << 16
    fit: Callable[[str, int], str] = _clip
    only: str | None = None  # "nodes": multi-node runs only; "gpu": once a GPU sample came
    group: Callable[[NodeView], Cell] | None = None  # a node's row (grouped); None: blank


def _node_cell(view: RowView) -> Cell:
    text = view.model.node_text(view.row)
    return (text, "red" if text.endswith("lost") else "")


def _node_lost(view: NodeView) -> Cell:
    """A node's own row names it already: its node cell says only whether it is lost."""
    lost = view.model.node_text(view.rows[0]).endswith("lost")
    return ("lost", "red") if lost else ("", "")


def _node_ranks(view: NodeView) -> Cell:
    """``▸ node 9``: closed (its ranks hidden), ``▾``: open."""
    return (f"{'▾' if view.opened else '▸'} node {view.node}", "bold")


def _node_gpu(key: str) -> Callable[[NodeView], Cell]:
    return lambda view: view.gpu[key]


def _gpu_cell(key: str) -> Callable[[RowView], Cell]:
    return lambda view: view.gpu[key]


def _gauge(key: str, text: Callable[[float], str]) -> Callable[[RowView], Cell]:
    """The cell of a sampled value (engine/sampler.py's gauges, by this column's key): "-" for
    a rank not running or not sampled yet."""
    def cell(view: RowView) -> Cell:
        value = view.row.gauges.get(key)
        return (text(value) if view.active and value is not None else "-", "")
    return cell


# In the table's order; how they give way when it is too narrow: GIVE_WAY.
COLUMNS = (
    Column("rank", "rank", 4, lambda v: (str(v.row.rank), "bold"), group=_node_ranks),
    Column("node", "node", 4, _node_cell, only="nodes", group=_node_lost),
    Column("local", "local", 5, lambda v: (str(v.row.local_rank), "")),
    Column("pid", "pid", 7, lambda v: (str(v.row.pid or "-"), "")),  # 4194304: the largest
    Column("state", "state", 8, lambda v: (v.row.state.value, v.style),
           group=lambda n: groups.state_cell(n, STATE_STYLES)),  # "6 run 2 fail"
    Column("cpu", "CPU %", 5, _gauge("cpu", lambda x: f"{x:5.1f}")),
    Column("rss", "RSS", 10, _gauge("rss", lambda x: human_bytes(int(x)) if x else "-")),
    *(Column(key, label, width, _gpu_cell(key), only="gpu",  # gpu_cells.py
             widest=24 if key == "gpu_mem" else 1 << 16, group=_node_gpu(key))
      for key, label, width in GPU_COLUMNS),
    Column("children", "kids", 4, _gauge("children", lambda x: str(int(x)))),
    Column("uptime", "uptime", 6, lambda v: (human_seconds(v.model.uptime(v.row)), "")),
    Column("age", "out age", 7, lambda v: (human_seconds(v.model.output_age(v.row)), ""),
           group=groups.output_age),
    # step/total as a bar, left of its numbers (progress_bar.py)
    Column("bar", "", BAR_CELLS, lambda v: bar_cell(v.row, v.style), fit=fit_bar,
           group=groups.bar_of),
    Column("progress", "progress", 16, lambda v: progress_cell(v.row), widest=24,
           fit=_clip_progress, group=lambda n: (groups.progress_text(n), "")),
    Column("exit", "exit", 9, lambda v: (v.row.exit_text(), v.style),  # "0 SUCCESS"
           group=groups.exit_cell),
    Column("signal", "signal", 6,
           lambda v: (v.row.signal_text(), "red" if v.row.signal else "magenta"), widest=32,
           group=groups.signal_cell),
    Column("last", "last line", LAST_LINE_CHARS,
           lambda v: (v.row.last_line[: LAST_LINE_CHARS * 2], ""), widest=LAST_LINE_CHARS),
)
BY_KEY = {column.key: column for column in COLUMNS}


def _text(cell: Cell) -> Text:
    plain, style = cell
    return Text(plain, style=style, no_wrap=True)


def fit_columns(wanted: dict[str, int], width: int, core: int) -> dict[str, int]:
    """The columns shown and their widths, in ``width`` cells (0: not laid out yet, all)."""
    widths = dict(wanted)
    shrunk: list[str] = []

    def excess() -> int:
        return sum(w + 2 * CELL_PADDING for w in widths.values()) - width

    for key, floor in GIVE_WAY:
        if width <= 0 or excess() <= 0:
            break
        if key not in widths:
            continue
        if floor is None:
            del widths[key]
            continue
        floor = core if floor == CORE else floor
        widths[key] = max(min(widths[key], floor), widths[key] - excess())
        shrunk.append(key)
    slack = -excess()
    for key in reversed(shrunk):
        if key in widths and slack > 0:
            grow = min(slack, wanted[key] - widths[key])
            widths[key] += grow
            slack -= grow
    return widths


class RankTable(DataTable[Text]):
    """Rows keyed by rank (``"12"``), or by node when grouped (``"n3"``, tui/node_groups.py);
    cells compared with what is shown before any update."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)  # type: ignore[arg-type]
        self._cells: dict[str, dict[str, Cell]] = {}  # every row's cells in full, in order
        self._shown: dict[tuple[str, str], Cell] = {}  # as shown: clipped to its column
        self._wanted = {column.key: column.width for column in COLUMNS}
        self._core = 0
        self._model: RunModel | None = None
        self.multi_node = False  # the node column shows only then
        self.gpu_shown = False  # the GPU columns show only then
        self.grouped = False  # a row per node (more ranks than the screen has rows)
        self.opened: set[int] = set()  # nodes whose ranks show (grouped)
        self.shown_widths: dict[str, int] = {}  # the columns shown and their widths

    def cells(self, model: RunModel, row: RankRow) -> dict[str, Cell]:
        """Each cell as (plain text, style): cheap to compare, made into Text only if changed."""
        view = RowView(model, row)
        cells = {column.key: column.cell(view) for column in COLUMNS}
        if self.grouped:  # under its node's row
            cells["rank"] = ("  " + cells["rank"][0], cells["rank"][1])
        return cells

    def node_cells(self, view: NodeView) -> dict[str, Cell]:
        return {column.key: column.group(view) if column.group else ("", "")
                for column in COLUMNS}

    def rows_of(self, model: RunModel) -> dict[str, dict[str, Cell]]:
        """Every row shown, in order: ranks, or nodes and the ranks shown under them."""
        if not self.grouped:
            return {str(rank): self.cells(model, model.ranks[rank]) for rank in sorted(model.ranks)}
        rows: dict[str, dict[str, Cell]] = {}
        for view, ranks in groups.group_rows(model, self.opened):
            rows[f"n{view.node}"] = self.node_cells(view)
            rows.update((str(row.rank), self.cells(model, row)) for row in ranks)
        return rows

    def refresh_from(self, model: RunModel) -> None:
        """Update only the cells whose text or style changed; lay out again only when needed.

        Every update_cell invalidates the table's render cache, but the repaint happens once
        per refresh whatever the number of changed cells. Rows in a new order (a node opened,
        a rank that now needs reading) rebuild the table once.
        """
        self._model = model
        self.multi_node = model.nnodes > 1
        self.gpu_shown = model.gpu.seen
        self.grouped = groups.grouped(model, self.screen.size.height if self.is_attached else 0)
        before = list(self._cells)
        self._cells = self.rows_of(model)
        for cells in self._cells.values():
            self._want(cells)
        layout = self._fit()
        order = list(self._cells)
        if layout != self.shown_widths or order[:len(before)] != before:
            self._rebuild(layout)
            return
        for key, cells in self._cells.items():
            if key not in self.rows:
                self._add_row(key, cells)
                continue
            for column, cell in self._clipped(cells).items():
                if self._shown.get((key, column)) != cell:
                    self._shown[(key, column)] = cell
                    self.update_cell(key, column, _text(cell))

    def _selected(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def selected_rank(self) -> int | None:
        key = self._selected()
        return int(key) if key is not None and key.isdigit() else None

    def selected_node(self) -> int | None:
        """The node whose row the cursor is on (grouped), else None."""
        key = self._selected()
        return int(key[1:]) if key is not None and key.startswith("n") else None

    def watching(self) -> Watch:
        """The other nodes whose ranks it shows: every node's, or those opened (grouped)."""
        return Watch(True, frozenset(self.opened) if self.grouped else None)

    def toggle_node(self, node: int) -> None:
        """Open a node's row to its ranks, or close it."""
        self.opened ^= {node}
        if self._model is not None:
            self.refresh_from(self._model)

    # ------------------------------------------------------------------ layout

    def on_resize(self) -> None:
        self._relayout()

    def watch_show_vertical_scrollbar(self) -> None:
        """The scrollbar takes a column or two of the table's width (or gives them back)."""
        self.call_later(self._relayout)

    def _relayout(self) -> None:
        if self._model is not None and self.grouped != groups.grouped(
                self._model, self.screen.size.height):
            self.refresh_from(self._model)  # the screen grew past the ranks, or shrank
            return
        layout = self._fit()
        if layout != self.shown_widths:
            self._rebuild(layout)

    def _want(self, cells: dict[str, Cell]) -> None:
        for key, (plain, _) in cells.items():
            width = min(cell_len(plain), BY_KEY[key].widest)
            if width > self._wanted[key]:
                self._wanted[key] = width
        core = cell_len(cells["progress"][0].split(" ", 1)[0])
        self._core = max(self._core, core)

    def _fit(self) -> dict[str, int]:
        width = self.scrollable_content_region.width if self.size.width else 0
        shown = {None, "nodes" if self.multi_node else None, "gpu" if self.gpu_shown else None}
        wanted = {k: w for k, w in self._wanted.items() if BY_KEY[k].only in shown}
        return fit_columns(wanted, width, self._core)

    def _clipped(self, cells: dict[str, Cell]) -> dict[str, Cell]:
        widths = self.shown_widths
        return {key: (BY_KEY[key].fit(plain, widths[key]), style)
                for key, (plain, style) in cells.items() if key in widths}

    def _add_row(self, key: str, cells: dict[str, Cell]) -> None:
        shown = self._clipped(cells)
        self.add_row(*(_text(cell) for cell in shown.values()), key=key)
        self._shown.update(((key, column), cell) for column, cell in shown.items())

    def _rebuild(self, layout: dict[str, int]) -> None:
        """Columns and rows anew, the cursor on the same row (by key: a node opening moves
        the rows under it); no highlight message (the selection did not change: the log pane
        keeps its rank)."""
        self.shown_widths = layout
        selected, row, scrolled = self._selected(), self.cursor_row, self.scroll_y
        with self.prevent(DataTable.RowHighlighted, DataTable.CellHighlighted):
            self.clear(columns=True)
            self._shown.clear()
            self.set_class(self.grouped, "-grouped")
            for column in COLUMNS:
                if column.key in layout:
                    self.add_column(Text(_clip(column.label, layout[column.key])),
                                    width=layout[column.key], key=column.key)
            for key, cells in self._cells.items():
                self._add_row(key, cells)
            if selected in self._cells:
                row = list(self._cells).index(selected)
            self.scroll_to(y=scrolled, animate=False)  # where it was (clear() went to the top)
            if 0 < row < self.row_count:
                self.move_cursor(row=row, animate=False)
