"""Progress as pictures in the TUI: the bars, the pace in the header, the curve panel (at most
once a second, only when it can be seen)."""

from __future__ import annotations

from typing import Any

import pytest
from scripted import scripted_app

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import ProgressSource
from forgelm_tui.tui.widgets.curves import CURVE_HZ, CurvePanel, CurveRow
from forgelm_tui.tui.widgets.rank_table import RankTable
from forgelm_tui.tui.widgets.run_header import RunHeader

pytestmark = pytest.mark.timeout(60)
SIZE = (170, 42)


async def test_bars_pace_and_curves_show_while_training_drawn_once_a_second() -> None:
    app, run, prepare = scripted_app("training")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        table = app.query_one(RankTable)
        assert str(table.get_cell("0", "bar")) == "█████░░░░░"  # 600/1200
        assert str(table.get_cell("0", "progress")) == "600/1200 loss 1.065"
        header = str(app.query_one(RunHeader).render())
        assert "10 steps/s" in header and "ETA 1m01s" in header  # rank 3: 615 steps left
        panel = app.query_one(CurvePanel)
        assert panel.display and [c.key for c in panel.shown] == ["run", "0", "1", "2", "3"]
        rows = list(app.query(CurveRow))
        assert len(rows) == 2 and panel.columns == 3  # 170 columns: 3 curves a row
        curves = [curve for row in rows for curve in row.curves]
        assert [c.label for c in curves] == ["run", "rank 0", "rank 1", "rank 2", "rank 3"]
        assert all(len(c.values) >= 100 for c in curves)  # 120 reports, none dropped yet
        # New steps redraw the curves at most once a second.
        panel.timer.pause()  # its own 1 Hz tick would draw on the same clock: the test's alone
        now = [1000.0]
        panel.clock, panel.drawn_at = (lambda: now[0]), None
        row = app.query(CurveRow).first()
        refreshes = [0]
        original = row.refresh

        def counted(*args: Any, **kwargs: Any) -> Any:
            refreshes[0] += 1
            return original(*args, **kwargs)

        row.refresh = counted  # type: ignore[method-assign]
        drawn = 0
        for tick in range(1, 17):  # 2 s of new steps at 8 Hz, each offered to the panel
            now[0] = 1000.0 + tick / 8
            for rank in range(4):
                run.emit(ev.RankProgressed(rank, 600 + tick, 1200, {"loss": 1.0 - tick / 100},
                                           ProgressSource.CHANNEL))
            drawn += panel.refresh_from_model()
            await pilot.pause()
        assert drawn == 2  # at 1000.125 and 1001.125: once a second
        assert refreshes[0] == drawn  # the first row of curves: repainted only when drawn
        assert CURVE_HZ == 1.0


async def test_no_curves_on_a_short_screen_and_none_before_a_metric() -> None:
    app, _, prepare = scripted_app("training")
    async with app.run_test(size=(80, 24)) as pilot:
        await prepare(pilot)
        panel = app.query_one(CurvePanel)
        assert not panel.display and panel.shown == []
        assert panel.refresh_from_model(force=True) is False  # hidden: no work at all
    app, run, _ = scripted_app("training")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        run.emit(ev.RankProgressed(0, 1, 10, {}, ProgressSource.CHANNEL))
        panel = app.query_one(CurvePanel)
        assert panel.refresh_from_model(force=True) is False and not panel.display


def test_snapshot_training(snap_compare: Any) -> None:
    app, _, prepare = scripted_app("training")
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare)
