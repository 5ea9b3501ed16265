"""The curve panel under the rank table: the run's loss (or first metric) and each rank's, drawn
by Textual's own sparkline (``textual.renderables.sparkline.Sparkline``, what the ``Sparkline``
widget renders).

Cheap by construction: it reads the model on its own timer, at most once a second whatever
else asks (``CURVE_HZ``); it does nothing while the screen is too short to show it (under 30
rows: the app's ``-short``/``-tiny`` classes hide it) or before any rank reported a metric; it
repaints only the rows in view (the panel scrolls when the ranks do not fit) and only when one
of their curves changed. One widget per row of curves, not two per curve: measured with 8 ranks
(bench/curves_cost.py), 27 small widgets cost about 1% of a core in Textual's layout and
compositing alone, a few row widgets almost nothing. Each sparkline draws its (down-sampled, at
most 200 points) curve into its width, a bucket's mean per cell.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.text import Text
from textual.containers import VerticalScroll
from textual.renderables.sparkline import Sparkline
from textual.widget import Widget

from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.progress_view import Curve, curves

CURVE_HZ = 1.0  # at most this many updates a second
CELL_WIDTH = 48  # a curve's share of the panel's width: label and at least 26 cells of curve
LABEL_WIDTH = 20  # "rank 63 loss 2.214"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def label(curve: Curve) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{curve.label:<7} ", style="bold")
    text.append(f"{curve.metric[:6]} {curve.values[-1]:.4g}" if curve.values else "")
    return text


class _Line:
    """One line of curves: a label padded to LABEL_WIDTH, its sparkline, a gap; segments
    straight out (a rich Table per row cost more than the sparklines themselves)."""

    def __init__(self, curves: tuple[Curve, ...], width: int, low: Color, high: Color) -> None:
        self.curves, self.width, self.low, self.high = curves, width, low, high

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for curve in self.curves:
            text = label(curve)
            text.truncate(LABEL_WIDTH, overflow="ellipsis", pad=True)
            yield from text.render(console, end=" ")
            yield from Sparkline(curve.values, width=self.width, min_color=self.low,
                                 max_color=self.high, summary_function=_mean
                                 ).__rich_console__(console, options)
            yield Segment("  ")


class CurveRow(Widget):
    """One row of the panel: a few curves side by side, each its label and its sparkline."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"curve--min-color", "curve--max-color"}
    DEFAULT_CSS = """
    CurveRow { height: 1; }
    CurveRow > .curve--max-color { color: $primary; }
    CurveRow > .curve--min-color { color: $primary 30%; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.curves: tuple[Curve, ...] = ()
        self.columns = 1

    def show(self, shown: tuple[Curve, ...], columns: int) -> bool:
        """These curves, in a row of ``columns``; False when nothing changed."""
        if (shown, columns) == (self.curves, self.columns):
            return False
        self.curves, self.columns = shown, columns
        self.refresh()
        return True

    def render(self) -> RenderableType:
        if not self.curves:
            return ""
        _, base = self.background_colors
        low = (base + self.get_component_styles("curve--min-color").color).rich_color
        high = (base + self.get_component_styles("curve--max-color").color).rich_color
        width = max(1, self.size.width // self.columns - LABEL_WIDTH - 3)
        return _Line(self.curves, width, low, high)


class CurvePanel(VerticalScroll, can_focus=False):
    """The run's curve first, then each rank's, in as many columns as the width allows."""

    def __init__(self, model: RunModel, *, clock: Callable[[], float] = time.monotonic,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.clock = clock
        self.drawn_at: float | None = None
        self.shown: list[Curve] = []  # every curve, as last drawn or waiting to be
        self.updates = 0  # rows repainted with new curves, ever (what the tests count)

    def on_mount(self) -> None:
        self.timer = self.set_interval(1 / CURVE_HZ, self.refresh_from_model)

    @property
    def columns(self) -> int:
        width = self.scrollable_content_region.width or self.screen.size.width - 2  # hidden yet
        return max(1, width // CELL_WIDTH)

    @property
    def hidden_by_size(self) -> bool:
        return self.screen.has_class("-short") or self.screen.has_class("-tiny")

    def refresh_from_model(self, force: bool = False) -> bool:
        """Draw what changed, at most CURVE_HZ times a second (``force``: now, for the tests
        and screenshots). False when it did nothing."""
        now = self.clock()
        if not force and self.drawn_at is not None and now - self.drawn_at < 1 / CURVE_HZ:
            return False
        if not self.is_mounted or self.hidden_by_size:
            return False
        shown = curves([self.model.ranks[r] for r in sorted(self.model.ranks)])
        if not shown:
            return False
        self.drawn_at, self.shown = now, shown
        rows = -(-len(shown) // self.columns)
        have = len(self.query_children(CurveRow))
        if have < rows:  # more ranks with a curve (or fewer columns): rows are added, once
            self.mount_all(CurveRow() for _ in range(rows - have))
            self.add_class("-drawn")
            self.call_after_refresh(self._draw)
            return True
        self._draw()
        return True

    def on_resize(self) -> None:
        if self.shown:
            self.call_after_refresh(self._draw)  # the columns may change with the width

    def _draw(self) -> None:
        """Only the rows in view (each one line high)."""
        columns, shown = self.columns, self.shown
        first = int(self.scroll_y)
        height = self.scrollable_content_region.height or len(shown)
        for index, row in enumerate(self.query_children(CurveRow)):
            part = tuple(shown[index * columns: (index + 1) * columns])
            if first <= index < first + height:
                self.updates += row.show(part, columns)
            row.display = bool(part)
