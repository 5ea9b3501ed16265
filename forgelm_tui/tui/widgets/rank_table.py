"""The rank table: one row per rank, only changed cells repainted, at most twice a second.

A column that widens changes the table's virtual size, and that is a layout pass of the whole
screen (25-50 ms here). Columns start as wide as the values they will soon hold (a pid, RSS,
uptime...), so the first samples of a run widen nothing; only rare cells (exit, signal, a long
progress text) may still widen a column.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from forgelm_tui.tui.model import RankRow, RunModel

LAST_LINE_CHARS = 40  # the log pane has the whole line; the table only a glimpse

# (key, label, starting width): "4194304" is the largest pid, "1023.9 MiB" the widest RSS,
# "59m59s" the widest uptime; progress is "step/total loss x".
COLUMNS = (
    ("rank", "rank", 4),
    ("local", "local", 5),
    ("pid", "pid", 7),
    ("state", "state", 8),
    ("cpu", "CPU %", 5),
    ("rss", "RSS", 10),
    ("children", "kids", 4),
    ("uptime", "uptime", 6),
    ("age", "out age", 7),
    ("progress", "progress", 16),
    ("exit", "exit", 9),  # "0 SUCCESS"
    ("signal", "signal", 6),
    ("last", "last line", LAST_LINE_CHARS),
)

STATE_STYLES = {
    "starting": "dim",
    "running": "green",
    "quiet": "yellow",
    "stopping": "bold magenta",
    "exited": "cyan",
    "failed": "bold red",
    "killed": "red",
}


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _text(cell: tuple[str, str]) -> Text:
    plain, style = cell
    return Text(plain, style=style, no_wrap=True)


def human_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def human_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    whole = int(value)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class RankTable(DataTable[Text]):
    """Rank rows keyed by rank; cells compared with what is shown before any update."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)  # type: ignore[arg-type]
        self._shown: dict[tuple[int, str], tuple[str, str]] = {}
        self._widths: dict[str, int] = {}

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            # An auto-width column fits its label and cells: trailing blanks in the label set
            # its starting width and stay invisible.
            self.add_column(label.ljust(width), key=key)
            self._widths[key] = width

    def cells(self, model: RunModel, row: RankRow) -> dict[str, tuple[str, str]]:
        """Each cell as (plain text, style): cheap to compare, made into Text only if changed."""
        style = STATE_STYLES.get(row.state.value, "")
        active = row.ended_at is None and row.pid is not None
        return {
            "rank": (str(row.rank), "bold"),
            "local": (str(row.local_rank), ""),
            "pid": (str(row.pid or "-"), ""),
            "state": (row.state.value, style),
            "cpu": (f"{row.cpu_percent:5.1f}" if active else "-", ""),
            "rss": (human_bytes(row.rss_bytes) if active and row.rss_bytes else "-", ""),
            "children": (str(row.children) if active else "-", ""),
            "uptime": (human_seconds(model.uptime(row)), ""),
            "age": (human_seconds(model.output_age(row)), ""),
            "progress": (row.progress_text(), ""),
            "exit": (row.exit_text(), style),
            "signal": (row.signal_text(), "red" if row.signal else "magenta"),
            "last": (_clip(row.last_line, LAST_LINE_CHARS), ""),
        }

    def refresh_from(self, model: RunModel) -> None:
        """Update only the cells whose text or style changed; widen a column only when needed.

        Every update_cell invalidates the table's render cache, but the repaint happens once
        per refresh whatever the number of changed cells.
        """
        for rank in sorted(model.ranks):
            row = model.ranks[rank]
            cells = self.cells(model, row)
            if str(rank) not in self.rows:
                self.add_row(*(_text(c) for c in cells.values()), key=str(rank))
                for key, cell in cells.items():
                    self._shown[(rank, key)] = cell
                    self._widths[key] = max(self._widths.get(key, 0), len(cell[0]))
                continue
            for key, cell in cells.items():
                if self._shown.get((rank, key)) == cell:
                    continue
                self._shown[(rank, key)] = cell
                wider = len(cell[0]) > self._widths.get(key, 0)
                if wider:
                    self._widths[key] = len(cell[0])
                self.update_cell(str(rank), key, _text(cell), update_width=wider)

    def selected_rank(self) -> int | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return int(key.value) if key.value is not None else None
