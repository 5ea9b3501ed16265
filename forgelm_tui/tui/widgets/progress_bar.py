"""A rank's step/total as a bar in its own column of the rank table, drawn at the column's width.

The cell is ``(fraction, style)`` like every other cell, the fraction written as text
(``"0.0250"``; empty when no total is known), so the table compares it as cheaply as the rest;
it becomes a bar only when fitted to its column (``fit_bar``). Eighth blocks give the bar a
resolution of 1/80 at 10 cells; the rest of the column is a light shade, so the scale shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no import cycle: the table imports this module, not the other way
    from forgelm_tui.tui.model import RankRow

BAR_CELLS = 10  # the bar's width when the table has room; it gives way like other columns
EIGHTHS = " ▏▎▍▌▋▊▉"  # a partly filled cell, by eighths
FULL, EMPTY = "█", "░"


def bar_cell(row: RankRow, style: str) -> tuple[str, str]:
    """``("0.0250", style)`` for a rank at step 30 of 1200; empty without a step or total."""
    return fraction_cell(row.step, row.total, style)


def fraction_cell(step: int | None, total: int | None, style: str) -> tuple[str, str]:
    """A step of a total as the bar column's cell (a rank's; a node's slowest rank's)."""
    if step is None or not total or total <= 0:
        return ("", "")
    return (f"{min(1.0, max(0.0, step / total)):.4f}", style)


def blocks(fraction: float, cells: int, empty: str = EMPTY) -> str:
    """``fraction`` of ``cells`` cells in block characters, to an eighth of a cell, padded with
    ``empty`` (the progress bars; the GPU memory bars)."""
    eighths = round(max(0.0, min(1.0, fraction)) * cells * 8)
    full, part = divmod(eighths, 8)
    bar = FULL * full + (EIGHTHS[part] if part else "")
    return bar + empty * (cells - len(bar))


def fit_bar(fraction: str, width: int) -> str:
    """The bar for ``fraction`` in exactly ``width`` cells (empty text: no bar)."""
    if not fraction or width <= 0:
        return ""
    return blocks(float(fraction), width)
