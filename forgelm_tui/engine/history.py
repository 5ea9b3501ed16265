"""A rank's metric history, down-sampled to a bounded size: the loss curve of a whole run.

Every reported value is offered; a series keeps every ``stride``-th one, and when it is full it
drops every other point it kept and doubles the stride. So it holds at most ``MAX_POINTS``
points spread evenly over the steps seen, always the first and the newest, at O(1) cost per
value (a halving every time the series fills: amortised O(1)), and the same reports always give
the same points. Cheaper than LTTB and as deterministic; a curve drawn in a terminal is 20 to
100 cells wide, so evenly spaced points lose nothing it could show.

Standard library only: the engine keeps it per rank (``RankRecord.history``), the envelope writes
it (``ranks[].metrics_history``), snapshots carry the curve's metric to viewers, and the TUI keeps
its own with the same class.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_POINTS = 200  # per metric per rank, the newest point included
MAX_METRICS = 8  # metrics kept per rank (the first seen): HF logs loss, grad_norm, lr, epoch
CURVE_METRIC = "loss"  # the metric the curves show when a rank reports it; else its first

Point = tuple[int, float]  # (step, value)


@dataclass(frozen=True)
class MetricSeries:
    """One metric of one rank, down-sampled: what a snapshot carries to a viewer."""

    name: str
    points: tuple[tuple[int, float], ...]


class Series:
    """One metric's points: every ``stride``-th value offered, plus the newest."""

    __slots__ = ("kept", "last", "limit", "offered", "stride")

    def __init__(self, limit: int = MAX_POINTS, points: Iterable[Point] = ()) -> None:
        if limit < 3:
            raise ValueError("a series keeps at least 3 points (first, one between, newest)")
        self.limit = limit
        self.kept: list[Point] = []
        self.last: Point | None = None
        self.stride = 1
        self.offered = 0
        for step, value in points:  # a restored series goes on from where it was
            self.add(step, value)

    def add(self, step: int | None, value: float) -> None:
        """Offer one value; ``step`` None counts values instead. A value that is not a finite
        number is skipped (a curve cannot draw it; the last reported metrics still say it)."""
        if not isinstance(value, int | float) or isinstance(value, bool) \
                or not math.isfinite(value):
            return
        x = self.offered if step is None else int(step)
        if self.last is not None and self.last[0] == x:  # the same step again: its newer value
            self.last = (x, float(value))
            if self.kept and self.kept[-1][0] == x:
                self.kept[-1] = self.last
            return
        point = (x, float(value))
        if self.offered % self.stride == 0:
            self.kept.append(point)
            if len(self.kept) >= self.limit:  # full (one place is the newest's): halve
                self.kept = self.kept[::2]
                self.stride *= 2
        self.offered += 1
        self.last = point

    def points(self) -> tuple[Point, ...]:
        """The kept points and the newest, oldest first: at most ``limit``."""
        if self.last is None:
            return ()
        if self.kept and self.kept[-1] == self.last:
            return tuple(self.kept)
        return (*self.kept, self.last)


class MetricsHistory:
    """Every metric of one rank (the first ``MAX_METRICS`` names it reported), down-sampled."""

    def __init__(self, limit: int = MAX_POINTS) -> None:
        self.limit = limit
        self.series: dict[str, Series] = {}

    @classmethod
    def restored(cls, saved: Iterable[MetricSeries], limit: int = MAX_POINTS) -> MetricsHistory:
        history = cls(limit)
        for each in saved:
            history.series[each.name] = Series(limit, each.points)
        return history

    def add(self, step: int | None, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            series = self.series.get(name)
            if series is None:
                if len(self.series) >= MAX_METRICS:
                    continue
                series = self.series[name] = Series(self.limit)
            series.add(step, value)

    def curve_name(self) -> str | None:
        """The metric drawn as this rank's curve: the loss, else the first one reported."""
        if CURVE_METRIC in self.series:
            return CURVE_METRIC
        return next(iter(self.series), None)

    def curve(self, name: str | None = None) -> tuple[Point, ...]:
        series = self.series.get(name or self.curve_name() or "")
        return series.points() if series else ()

    def snapshot(self) -> tuple[MetricSeries, ...]:
        """What a snapshot carries: the curve's metric only (kept small: a viewer draws it)."""
        name = self.curve_name()
        return () if name is None else (MetricSeries(name, self.curve(name)),)

    def as_dict(self) -> dict[str, list[list[float]]]:
        """The envelope's ``metrics_history``: ``{"loss": [[step, value], ...]}``."""
        return {name: [[step, value] for step, value in series.points()]
                for name, series in self.series.items() if series.last is not None}
