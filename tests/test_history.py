"""The metric history: bounded, first and newest kept, deterministic; in snapshots and the
envelope (engine/history.py, docs/envelope.md)."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest
from conftest import rank_record
from scripted import FakeClock, ScriptedRun, state_failed

from forgelm_tui.engine import codec
from forgelm_tui.engine.events import RunSnapshot
from forgelm_tui.engine.history import (
    MAX_METRICS,
    MAX_POINTS,
    MetricSeries,
    MetricsHistory,
    Series,
)
from forgelm_tui.engine.records import RankRecord

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("count", [0, 1, 2, 199, 200, 201, 399, 400, 401, 1000, 12345])
def test_a_series_is_bounded_and_keeps_the_first_and_the_newest(count: int) -> None:
    series = Series()
    for step in range(1, count + 1):
        series.add(step, 1.0 / step)
        assert len(series.points()) <= MAX_POINTS
    points = series.points()
    assert len(points) == min(count, len(points)) and len(points) <= MAX_POINTS
    if count:
        assert points[0] == (1, 1.0)
        assert points[-1] == (count, 1.0 / count)
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps))  # in step order, no step twice
    if count >= MAX_POINTS:
        assert len(points) >= MAX_POINTS // 2  # it thins out, it never empties


def test_the_kept_points_are_evenly_spread() -> None:
    series = Series(limit=10)
    for step in range(100):
        series.add(step, float(step))
    steps = [step for step, _ in series.points()]
    inner = steps[:-1]  # the newest is added to the evenly spaced ones
    gaps = {b - a for a, b in itertools.pairwise(inner)}
    assert len(gaps) == 1 and steps[-1] == 99 and len(steps) <= 10


def test_the_same_reports_give_the_same_points() -> None:
    rng = random.Random(7)
    reports = [(step, rng.random()) for step in range(5000)]
    first, second = Series(), Series()
    for step, value in reports:
        first.add(step, value)
    for step, value in reports:
        second.add(step, value)
    assert first.points() == second.points()


def test_a_step_reported_again_keeps_its_newest_value_and_bad_values_are_skipped() -> None:
    series = Series()
    series.add(1, 3.0)
    series.add(1, 2.5)
    series.add(2, math.nan)
    series.add(2, math.inf)
    series.add(3, True)  # a bool is no metric value
    series.add(4, 2.0)
    assert series.points() == ((1, 2.5), (4, 2.0))
    counted = Series()
    for value in (3.0, 2.0, 1.0):
        counted.add(None, value)  # no step: values are counted
    assert counted.points() == ((0, 3.0), (1, 2.0), (2, 1.0))
    with pytest.raises(ValueError):
        Series(limit=2)


def test_metrics_are_bounded_in_number_and_the_curve_is_the_loss() -> None:
    history = MetricsHistory()
    history.add(1, {"lr": 0.1, "loss": 2.0})
    assert history.curve_name() == "loss"
    assert history.snapshot() == (MetricSeries("loss", ((1, 2.0),)),)
    history.add(2, {f"m{i}": float(i) for i in range(20)})
    assert len(history.series) == MAX_METRICS
    only_lr = MetricsHistory()
    only_lr.add(5, {"lr": 0.1})
    assert only_lr.curve_name() == "lr" and only_lr.curve() == ((5, 0.1),)
    assert MetricsHistory().snapshot() == () and MetricsHistory().as_dict() == {}


def test_a_restored_history_goes_on_bounded() -> None:
    saved = (MetricSeries("loss", tuple((s, 1.0) for s in range(MAX_POINTS))),)
    history = MetricsHistory.restored(saved)
    for step in range(MAX_POINTS, 3 * MAX_POINTS):
        history.add(step, {"loss": 0.5})
    points = history.curve()
    assert len(points) <= MAX_POINTS and points[0] == (0, 1.0)
    assert points[-1] == (3 * MAX_POINTS - 1, 0.5)


def _record(steps: int) -> RankRecord:
    record = rank_record(0, "/r", pid=4242, started_at=1.0, started_mono=1.0)
    for step in range(1, steps + 1):
        record.history.add(step, {"loss": 3.0 / step, "lr": 0.01})
    return record


def test_the_snapshot_carries_the_curve_through_json() -> None:
    rank = _record(1000).snapshot()
    assert [s.name for s in rank.metrics_history] == ["loss"]
    assert len(rank.metrics_history[0].points) <= MAX_POINTS
    snap = RunSnapshot("r", 1, ("x",), "/r", 1.0, (rank,))
    wire = json.loads(json.dumps(codec.to_wire(snap)))
    assert codec.from_wire(wire) == snap
    del wire["ranks"][0]["metrics_history"]  # a sender without the field: no curve, no error
    assert codec.from_wire(wire).ranks[0].metrics_history == ()
    assert len(json.dumps(codec.to_wire(rank))) < 8000  # bounded: one metric, <= 200 points


def test_the_envelope_has_each_ranks_bounded_history(tmp_path: object) -> None:
    ending = state_failed(ScriptedRun(2), FakeClock())
    for rank in ending.envelope["ranks"]:
        assert rank["metrics_history"] == {}  # no metric reported: an empty object
    from forgelm_tui.envelope.entries import rank_entry

    entry = rank_entry(_record(5000), None)
    history = entry["metrics_history"]
    assert set(history) == {"loss", "lr"}
    assert all(len(points) <= MAX_POINTS for points in history.values())
    assert history["loss"][0] == [1, 3.0] and history["loss"][-1] == [5000, 3.0 / 5000]
    json.dumps(entry)  # plain JSON
