"""The run's pace (steps/s, ETA) and the curves, from the TUI's model on an injected clock."""

from __future__ import annotations

import pytest
from scripted import T0, FakeClock

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import ProgressSource, RankState
from forgelm_tui.engine.history import MetricSeries
from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.progress_view import (
    RATE_WINDOW,
    RankHistory,
    mean_curve,
    rate_text,
    run_pace,
)
from forgelm_tui.tui.widgets.progress_bar import fit_bar

pytestmark = pytest.mark.timeout(30)


def _model(world: int = 2) -> tuple[RunModel, FakeClock]:
    clock = FakeClock()
    model = RunModel("r", ["x"], world, clock)
    model.apply(ev.RunStarted("r", world, ("x",), "/r", T0))
    for rank in range(world):
        model.apply(ev.RankStarted(rank, rank, 100 + rank, T0))
        model.apply(ev.RankStateChanged(rank, RankState.RUNNING))
    return model, clock


def _step(model: RunModel, rank: int, step: int, total: int | None = 100,
          loss: float | None = None) -> None:
    metrics = {} if loss is None else {"loss": loss}
    model.apply(ev.RankProgressed(rank, step, total, metrics, ProgressSource.CHANNEL))


def test_the_rate_is_measured_over_the_window_and_the_eta_follows_the_slowest() -> None:
    model, clock = _model()
    assert run_pace(model.ranks.values(), clock()) is None  # no step yet
    for second in range(61):
        _step(model, 0, 2 * second)  # 2 steps/s for a minute
        if second % 2 == 0:
            _step(model, 1, second // 2)  # 0.5 steps/s
        clock.advance(1)
    pace = run_pace(model.ranks.values(), clock())
    assert pace is not None
    assert pace.rate == pytest.approx(0.5)
    assert pace.eta == pytest.approx((100 - 30) / 0.5)  # rank 1 finishes last
    # Only the last RATE_WINDOW seconds count: rank 0 speeds up to 10 steps/s.
    for _ in range(int(RATE_WINDOW) + 1):
        clock.advance(1)
        _step(model, 0, model.ranks[0].step + 10 if model.ranks[0].step is not None else 0)
    assert model.ranks[0].history.rate(clock()) == pytest.approx(10.0)


def test_a_rank_silent_for_a_window_has_no_eta_and_an_ended_rank_no_say() -> None:
    model, clock = _model()
    for step in range(5):
        _step(model, 0, step)
        _step(model, 1, step)
        clock.advance(1)
    clock.advance(RATE_WINDOW + 1)
    _step(model, 0, 6)
    pace = run_pace(model.ranks.values(), clock())
    assert pace is not None and pace.rate == 0.0 and pace.eta is None  # rank 1 stuck
    model.apply(ev.RankExited(1, 0, None, False, clock()))
    model.apply(ev.RankStateChanged(1, RankState.EXITED))
    pace = run_pace(model.ranks.values(), clock())
    assert pace is not None and pace.rate > 0 and pace.eta is not None


def test_a_step_going_back_restarts_the_rate_and_no_total_means_no_eta() -> None:
    history = RankHistory()
    history.add(50, {}, T0)
    history.add(60, {}, T0 + 1)
    history.add(1, {}, T0 + 2)  # a new loop
    assert history.rate(T0 + 2) is None
    model, clock = _model(1)
    _step(model, 0, 1, None)
    clock.advance(2)
    _step(model, 0, 5, None)
    pace = run_pace(model.ranks.values(), clock())
    assert pace is not None and pace.rate == 2.0 and pace.eta is None


def test_rate_text() -> None:
    assert rate_text(25.4) == "25 steps/s"
    assert rate_text(2.54) == "2.5 steps/s"
    assert rate_text(0.25) == "4.0 s/step"
    assert rate_text(0.0) == "0 steps/s"


def test_curves_repeat_no_unchanged_metric_and_the_run_curve_is_the_mean() -> None:
    model, clock = _model()
    for step in range(1, 4):
        _step(model, 0, step, loss=3.0 - step)
        _step(model, 1, step, loss=5.0 - step)
        clock.advance(1)
    _step(model, 0, 4)  # the same metrics again (no new value): no point
    model.apply(ev.RankProgressed(0, 5, 100, {"loss": -1.0}, ProgressSource.CHANNEL))
    model.apply(ev.RankProgressed(0, 6, 100, {"loss": -1.0}, ProgressSource.CHANNEL))
    from forgelm_tui.tui.progress_view import curves

    shown = curves([model.ranks[0], model.ranks[1]])
    assert [c.key for c in shown] == ["run", "0", "1"]
    assert shown[1].values == (2.0, 1.0, 0.0, -1.0)  # step 6 repeated step 5's: no point
    assert shown[0].values == (3.0, 2.0, 1.0, -1.0)  # steps 1-3: both ranks; step 5: rank 0
    assert mean_curve([((1, 1.0), (2, 3.0)), ((2, 5.0),)]) == (1.0, 4.0)
    assert curves([]) == []


def test_a_snapshot_restores_the_curve() -> None:
    model, _ = _model(1)
    snap = ev.RankSnapshot(
        0, 0, 0, 100, RankState.RUNNING, T0, None, None, None, (), "", None, 7, 10,
        {"loss": 1.0}, ProgressSource.CHANNEL, {},
        metrics_history=(MetricSeries("loss", ((1, 3.0), (7, 1.0))),))
    model.restore(ev.RunSnapshot("r", 1, ("x",), "/r", T0, (snap,)))
    assert model.ranks[0].history.metrics.curve() == ((1, 3.0), (7, 1.0))


@pytest.mark.parametrize(("fraction", "width", "bar"), [
    ("0.0000", 10, "░░░░░░░░░░"), ("1.0000", 4, "████"), ("0.5000", 4, "██░░"),
    ("0.0250", 10, "▎░░░░░░░░░"), ("0.3100", 6, "█▉░░░░"), ("", 10, ""), ("0.5", 0, "")])
def test_the_bar_fills_its_column(fraction: str, width: int, bar: str) -> None:
    assert fit_bar(fraction, width) == bar
