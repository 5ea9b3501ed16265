"""The curve panel under the rank table: the run's loss (or first metric) and each rank's, as
Textual's own ``Sparkline`` widgets.

Cheap by construction: it reads the model on its own timer, at most once a second whatever
else asks (``CURVE_HZ``); it does nothing while the screen is too short to show it (under 30
rows: the app's ``-short``/``-tiny`` classes hide it) or before any rank reported a metric; it
hands new data only to the sparklines in view (the panel scrolls when the ranks do not fit) and
only when their curve changed. Each sparkline draws its (down-sampled, at most 200 points)
curve into its width, a bucket's mean per cell.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widget import Widget
from textual.widgets import Sparkline

from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.progress_view import Curve, curves

CURVE_HZ = 1.0  # at most this many updates a second
CELL_WIDTH = 48  # a curve's share of the panel's width: label and at least 28 cells of curve
LABEL_WIDTH = 20  # "rank 63 loss 2.214"


class CurveLabel(Widget):
    """Fixed size, repainted without a layout pass (a Static.update reflows the screen)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.text = Text()

    def render(self) -> Text:
        return self.text

    def show(self, text: Text) -> None:
        if text != self.text:
            self.text = text
            self.refresh()


class CurveCell(Horizontal):
    """One curve: ``rank 3 loss 2.214`` and its sparkline."""

    def __init__(self, key: str, **kwargs: Any) -> None:
        super().__init__(classes="curve -run" if key == "run" else "curve", **kwargs)
        self.key = key
        self.values: tuple[float, ...] = ()

    def compose(self) -> ComposeResult:
        yield CurveLabel(classes="curve-label")
        yield Sparkline((), summary_function=statistics.fmean)

    def show(self, curve: Curve) -> bool:
        """The curve's newest value and its picture; False when nothing changed."""
        label = Text(no_wrap=True, overflow="ellipsis")
        label.append(f"{curve.label:<7} ", style="bold")
        label.append(f"{curve.metric[:6]} {curve.values[-1]:.4g}" if curve.values else "")
        self.query_one(CurveLabel).show(label)
        if curve.values == self.values:
            return False
        self.values = curve.values
        self.query_one(Sparkline).data = list(curve.values)
        return True


class CurvePanel(VerticalScroll, can_focus=False):
    """The run's curve first, then each rank's, in as many columns as the width allows."""

    def __init__(self, model: RunModel, *, clock: Callable[[], float] = time.monotonic,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.clock = clock
        self.cells: dict[str, CurveCell] = {}
        self.drawn_at: float | None = None
        self.updates = 0  # sparklines given new data, ever (what the tests count)

    def on_mount(self) -> None:
        self.timer = self.set_interval(1 / CURVE_HZ, self.refresh_from_model)

    def on_resize(self) -> None:
        self.styles.grid_size_columns = max(1, self.size.width // CELL_WIDTH)

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
        self.drawn_at = now
        new = [CurveCell(c.key) for c in shown if c.key not in self.cells]
        if new:
            self.cells.update((cell.key, cell) for cell in new)
            self.mount_all(new)
            self.add_class("-drawn")
            self.call_after_refresh(self._draw, shown)  # their sparklines exist once mounted
            return True
        self._draw(shown)
        return True

    def _draw(self, shown: list[Curve]) -> None:
        """Only the rows in view (each curve is one row high)."""
        by_key = {curve.key: curve for curve in shown}
        columns = max(1, self.styles.grid_size_columns or 1)
        first = int(self.scroll_y)
        rows = self.scrollable_content_region.height or len(shown)
        for index, cell in enumerate(self.query_children(CurveCell)):
            curve = by_key.get(cell.key)
            if curve is not None and first <= index // columns < first + rows:
                self.updates += cell.show(curve)
