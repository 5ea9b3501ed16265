"""Progress as the TUI shows it, beyond the step: each rank's curve and step rate, the run's pace.

Plain state and pure functions (no Textual): the model keeps a :class:`RankHistory` per row and
feeds it every ``RankProgressed``; the header asks :func:`run_pace`, the curve panel
:func:`curves`. docs/progress.md ("Progress as pictures") says how each figure is made.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from forgelm_tui.engine.history import MetricSeries, MetricsHistory

RATE_WINDOW = 30.0  # seconds of step reports a rank's rate is measured over
MAX_STEP_MARKS = 256  # (time, step) pairs kept per rank for its rate, whatever the step rate


class RankHistory:
    """One rank's curve (its metrics, down-sampled as the engine does) and recent steps."""

    def __init__(self, saved: Iterable[MetricSeries] = ()) -> None:
        self.metrics = MetricsHistory.restored(saved)
        self.marks: deque[tuple[float, int]] = deque(maxlen=MAX_STEP_MARKS)
        self._last_metrics: Mapping[str, float] = {}

    def add(self, step: int | None, metrics: Mapping[str, float], now: float) -> None:
        """A progress report at wall-clock ``now``. Metrics repeated unchanged with a later
        step are the last values again, not new ones: not another point of the curve."""
        if metrics and metrics != self._last_metrics:
            self.metrics.add(step, metrics)
            self._last_metrics = dict(metrics)
        if step is None or (self.marks and self.marks[-1][1] == step):
            return
        if self.marks and step < self.marks[-1][1]:
            self.marks.clear()  # the step went back (a restarted loop): the rate starts again
        self.marks.append((now, step))
        while len(self.marks) > 2 and self.marks[1][0] <= now - RATE_WINDOW:
            self.marks.popleft()  # one mark at or before the window's start stays: the base

    def seen(self, metrics: Mapping[str, float]) -> None:
        """``metrics`` are the curve's last point already (a curve restored whole)."""
        self._last_metrics = dict(metrics)

    def carry(self, old: RankHistory, curve: bool) -> None:
        """Go on from ``old`` (another node's rank, a view replacing its row): its step marks,
        and with ``curve`` its curve too (a view that came without one)."""
        self.marks = old.marks
        if curve:
            self.metrics, self._last_metrics = old.metrics, old._last_metrics

    def rate(self, now: float) -> float | None:
        """Steps per second over the last RATE_WINDOW seconds of reports; 0 when the rank has
        reported no step for a whole window; None until two steps were seen."""
        if len(self.marks) < 2:
            return None
        (t0, s0), (t1, s1) = self.marks[0], self.marks[-1]
        if now - t1 > RATE_WINDOW:
            return 0.0
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


class RankRow(Protocol):
    """What is read of a model's row (``tui.model.RankRow``, which imports this module)."""

    rank: int
    step: int | None
    total: int | None
    history: RankHistory

    @property
    def ended(self) -> bool: ...


class Pace(NamedTuple):
    rate: float  # steps/s of the slowest live rank
    eta: float | None  # seconds until the last live rank reaches its total; None: not known


def run_pace(rows: Iterable[RankRow], now: float) -> Pace | None:
    """The run's pace from its live ranks that report steps: the slowest rank's rate, and
    the latest finish (each rank's remaining steps at its own rate). None while no live rank
    has a rate yet."""
    rates: list[float] = []
    finishes: list[float | None] = []
    for row in rows:
        if row.ended or row.step is None:
            continue
        rate = row.history.rate(now)
        if rate is None:
            continue
        rates.append(rate)
        if row.total:
            left = max(0, row.total - row.step)
            finishes.append(left / rate if rate > 0 else (0.0 if left == 0 else None))
    if not rates:
        return None
    eta = None if not finishes or None in finishes else max(f for f in finishes if f is not None)
    return Pace(min(rates), eta)


def rate_text(rate: float) -> str:
    """``12 steps/s``, ``2.5 steps/s``, ``4.0 s/step`` (slower than one a second, as tqdm)."""
    if rate <= 0:
        return "0 steps/s"
    if rate < 1:
        return f"{1 / rate:.1f} s/step"
    return f"{rate:.0f} steps/s" if rate >= 10 else f"{rate:.1f} steps/s"


class Curve(NamedTuple):
    key: str  # "run" or the rank's number
    label: str  # "rank 3"
    metric: str
    values: tuple[float, ...]  # oldest first


def curves(rows: Sequence[RankRow]) -> list[Curve]:
    """The run's curve (the mean over ranks at each step), then one per rank with a curve.

    Every rank draws the same metric: the loss when any rank reports one, else the first
    metric of the lowest rank that reports any."""
    names = [row.history.metrics.curve_name() for row in rows]
    metric = "loss" if "loss" in names else next((n for n in names if n), None)
    if metric is None:
        return []
    per_rank = [(row, row.history.metrics.curve(metric)) for row in rows]
    per_rank = [(row, points) for row, points in per_rank if points]
    if not per_rank:
        return []
    return [Curve("run", "run", metric, mean_curve(points for _, points in per_rank)),
            *(Curve(str(row.rank), f"rank {row.rank}", metric,
                    tuple(value for _, value in points)) for row, points in per_rank)]


def mean_curve(series: Iterable[Sequence[tuple[int, float]]]) -> tuple[float, ...]:
    """The mean at each step any series has, in step order: ranks of one DDP run report the
    same steps, so their down-sampled points fall on the same steps."""
    sums: dict[int, list[float]] = {}
    for points in series:
        for step, value in points:
            total = sums.setdefault(step, [0.0, 0.0])
            total[0] += value
            total[1] += 1
    return tuple(s / n for _, (s, n) in sorted(sums.items()) if n and math.isfinite(s / n))
