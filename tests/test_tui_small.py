"""80x24 as a first-class size (issue 9): what must show does, at 80x24 and up to 160x45, and
down to 40x12 for a dialog. Checked on the rendered screen, as an operator in tmux sees it."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from scripted import T0, FakeClock, ScriptedRun, scripted_app, state_failed
from textual.app import App
from textual.widget import Widget

from forgelm_tui.engine import events as ev
from forgelm_tui.tui.screens.confirm import ConfirmCancel
from forgelm_tui.tui.screens.help import HelpScreen
from forgelm_tui.tui.widgets.key_hints import KeyHints
from forgelm_tui.tui.widgets.log_pane import LogPane
from forgelm_tui.tui.widgets.rank_table import RankTable, _clip, _clip_progress, fit_columns
from forgelm_tui.tui.widgets.run_header import RunHeader
from forgelm_tui.tui.widgets.verdict_panel import VerdictPanel, exception_line
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(60)
SMALL = (80, 24)
SIZES = [(80, 24), (100, 30), (120, 32), (160, 45)]


def screen_lines(app: App[Any]) -> list[str]:
    """The screen as text, one string per row: what export_screenshot draws, without styles."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True,
                      force_terminal=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(
        full=True, screen_stack=app._background_screens))
    return console.export_text(styles=False).splitlines()


def region_text(app: App[Any], widget: Widget) -> list[str]:
    """The rows of the screen ``widget`` covers, cut to its columns."""
    region = widget.region
    rows = screen_lines(app)[region.y: region.bottom]
    return [row[region.x: region.right] for row in rows]


def panel_rows(app: App[Any]) -> list[str]:
    """The verdict panel's rows inside its border, stripped."""
    return [row.strip("│ ▄▀▂▆▁▇█▅▃") for row in region_text(app, app.query_one(VerdictPanel))]


# ---------------------------------------------------------------------- the verdict


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_failure_verdict_shows_what_must_show(tmp_path: Path, size: tuple[int, int]) -> None:
    app, _, prepare = scripted_app("crashed", envelope_dir=tmp_path)
    async with app.run_test(size=size) as pilot:
        await prepare(pilot)
        rows = panel_rows(app)
        shown = "\n".join(rows)
        assert "exit 2 TRAINING_ERROR" in shown and "runtime error" in shown
        assert "CI action: investigate logs" in shown
        assert "decided by: rule 2: root cause: rank 2 failed on its own (exit 2)" in shown
        assert "root cause: rank 2: ValueError: boom" in shown
        # A path longer than the panel is wide folds onto the next row, whole.
        assert f"envelope:{tmp_path / 'envelope.json'}" in "".join(rows).replace(" ", "")


async def test_demo_failure_at_80x24_keeps_the_envelope_path(tmp_path: Path) -> None:
    app, _, prepare = scripted_app("failed", envelope_dir=tmp_path)
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        rows = panel_rows(app)
        assert "root cause: rank 1: RuntimeError: CUDA out of memory" in "\n".join(rows)
        assert f"envelope:{tmp_path / 'envelope.json'}" in "".join(rows).replace(" ", "")


async def test_a_verdict_with_no_details_still_shows_its_summary(tmp_path: Path) -> None:
    """A plain success: nothing to scroll, and the summary is all there is (a docked summary
    alone would leave an auto-height panel empty)."""
    from dataclasses import replace

    app, run, prepare = scripted_app("running")
    async with app.run_test(size=(150, 45)) as pilot:
        await prepare(pilot)
        ending = state_failed(ScriptedRun(8), FakeClock(), tmp_path)
        envelope = {**ending.envelope, "root_cause_rank": None, "cancelled": None,
                    "exit_code": 0, "exit_name": "EXIT_SUCCESS", "exit_meaning": "completed",
                    "ranks": [{**r, "signal": None} for r in ending.envelope["ranks"]]}
        run.finish(replace(ending, envelope=envelope))
        await pilot.pause()
        rows = "\n".join(panel_rows(app))
        assert "exit 0 SUCCESS" in rows and "envelope:" in rows


@pytest.mark.parametrize("deep", [False, True], ids=["path", "long-path"])
async def test_verdict_details_scroll_inside_the_panel(tmp_path: Path, deep: bool) -> None:
    """Details scroll under the summary; a long envelope path (wrapped over rows) still
    leaves rows for them at 80x24."""
    if deep:
        tmp_path = tmp_path / ("runs-of-a-long-named-project-" * 3) / "2026-12-01"
        tmp_path.mkdir(parents=True)
    app, _, prepare = scripted_app("crashed", envelope_dir=tmp_path)
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        panel = app.query_one(VerdictPanel)
        assert panel.max_scroll_y > 0 and "tab" in str(panel.border_subtitle)
        # The traceback's last line is below, out of view.
        assert not any(row.startswith("ValueError: boom") for row in panel_rows(app))
        before = "".join(panel_rows(app))
        panel.focus()
        for _ in range(100):  # focus arrives through the message queue
            if app.focused is panel:
                break
            await pilot.pause(0.02)
        await pilot.press("end")
        for _ in range(100):  # "end" may animate the scroll: wait for it (a deadline, no sleep)
            if panel.scroll_y >= panel.max_scroll_y:
                break
            await pilot.pause(0.02)
        await pilot.pause()
        rows = panel_rows(app)
        # The traceback's own line (a scrollbar glyph may follow it on the same row).
        assert any(row.startswith("ValueError: boom") for row in rows), (
            panel.scroll_y, panel.max_scroll_y, app.focused, "\n".join(rows))
        assert any(row.startswith("root cause: rank 2: ValueError: boom") for row in rows)
        assert f"envelope:{tmp_path / 'envelope.json'}" in "".join(rows).replace(" ", "")
        assert "".join(rows) != before


def test_exception_line_is_the_last_exception_not_the_last_line() -> None:
    tail = ["Traceback (most recent call last):", '  File "x.py", line 1', "ValueError: boom",
            "[W socket.cpp] connection closed", ""]
    assert exception_line({"stderr_tail": tail}) == "ValueError: boom"
    assert exception_line({"error": {"traceback": "Traceback\n  x\nKeyError: 'k'\n"},
                           "stderr_tail": tail}) == "KeyError: 'k'"
    assert exception_line({"stderr_tail": ["killed by the OOM killer", ""]}) == \
        "killed by the OOM killer"
    assert exception_line({"stderr_tail": ["ValueError: \x1b[31mred\x1b[0m [/]"]}) == \
        "ValueError: red [/]"  # sanitised, never markup
    assert exception_line({}) == ""


# ---------------------------------------------------------------------- the header


async def test_header_is_one_line_with_the_countdown_at_80x24() -> None:
    app, _, prepare = scripted_app("cancelling")
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        header = app.query_one(RunHeader)
        assert header.region.height == 1
        line = region_text(app, header)[0]
        assert "STOPPING" in line and "SIGKILL in 24 s" in line, line
        assert "…" not in line  # shortened by leaving parts out, not cut


async def test_header_keeps_state_and_countdown_down_to_40_columns() -> None:
    app, _, prepare = scripted_app("cancelling")
    async with app.run_test(size=(40, 12)) as pilot:
        await prepare(pilot)
        line = region_text(app, app.query_one(RunHeader))[0]
        assert line.strip().startswith("STOPPING") and "SIGKILL in 24 s" in line, line


async def test_a_tall_screen_shows_the_command_too() -> None:
    app, _, prepare = scripted_app("running")
    async with app.run_test(size=(80, 40)) as pilot:
        await prepare(pilot)
        rows = region_text(app, app.query_one(RunHeader))
        assert len(rows) == 2 and "RUNNING" in rows[0]
        assert "forgelm-tui --nproc-per-node 8 --config job.yaml" in rows[1]


# ---------------------------------------------------------------------- the rank table


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 160])
async def test_progress_is_never_cut_into_a_wrong_number(width: int) -> None:
    app, _, prepare = scripted_app("crashed")
    async with app.run_test(size=(width, 24)) as pilot:
        await prepare(pilot)
        table = app.query_one(RankTable)
        shown = "\n".join(region_text(app, table))
        assert not re.search(r"40/10(?!0)", shown), shown
        assert table.max_scroll_x == 0  # nothing hides to the right
        for column in ("rank", "state", "exit", "signal"):
            assert column in table.shown_widths
        if width >= 60:
            assert "40/100" in shown and "2 TRAINING" in shown and "SIGTERM" in shown, shown


async def test_columns_give_way_by_priority() -> None:
    app, _, prepare = scripted_app("cancelling")
    async with app.run_test(size=(170, 42)) as pilot:
        await prepare(pilot)
        table = app.query_one(RankTable)
        assert {"cpu", "rss", "children", "uptime"} <= set(table.shown_widths)
        await pilot.resize_terminal(*SMALL)
        await pilot.pause()
        columns = set(table.shown_widths)
        assert not columns & {"cpu", "rss", "children", "uptime"}
        assert {"rank", "state", "exit", "signal", "progress", "last"} <= columns
        header = region_text(app, table)[0]
        assert "exit" in header and "signal" in header


def test_fit_columns_and_clipping() -> None:
    wanted = {"rank": 4, "local": 5, "pid": 7, "state": 8, "cpu": 5, "rss": 10, "children": 4,
              "uptime": 6, "age": 7, "progress": 16, "exit": 16, "signal": 30, "last": 40}
    assert fit_columns(wanted, 0, 6) == wanted  # not laid out yet
    assert fit_columns(wanted, 400, 6) == wanted
    for width in (40, 80, 120):
        widths = fit_columns(wanted, width, 6)
        assert sum(w + 2 for w in widths.values()) <= width
        assert {"rank", "state", "exit", "signal"} <= set(widths)
        assert widths["rank"] == 4 and widths["state"] == 8
    assert fit_columns(wanted, 80, 6) == {"rank": 4, "state": 8, "progress": 6, "exit": 16,
                                          "signal": 22, "last": 12}
    assert fit_columns(wanted, 40, 6) == {"rank": 4, "state": 8, "exit": 12, "signal": 8}
    assert _clip("40/100", 5) == "…"  # never "40/1…", never "40/10"
    assert _clip("SIGTERM, sent: operator cancel", 10) == "SIGTERM, …"
    assert _clip("loss 2.153", 9) == "loss …"
    assert _clip("日本語のログ", 5) == "日本…"
    assert _clip_progress("40/100 loss 1.9", 6) == "40/100"
    assert _clip_progress("40/100 loss 1.9", 8) == "40/100"
    assert _clip_progress("40/100 loss 1.9", 12) == "40/100 loss…"


async def test_a_new_layout_keeps_the_selected_rank_and_its_log() -> None:
    app, _, prepare = scripted_app("running")
    async with app.run_test(size=(170, 42)) as pilot:
        await prepare(pilot)
        await pilot.press("down", "down", "enter")
        assert app.query_one(LogPane).rank == 2
        await pilot.resize_terminal(*SMALL)
        await pilot.pause()
        assert app.query_one(RankTable).selected_rank() == 2
        assert app.query_one(LogPane).rank == 2


async def test_a_tick_updates_only_changed_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        table = app.query_one(RankTable)
        updates: list[tuple[str, str]] = []
        rebuilds: list[object] = []
        monkeypatch.setattr(table, "update_cell", lambda row, col, *a, **k: updates.append(
            (str(row), str(col))))
        monkeypatch.setattr(table, "_rebuild", rebuilds.append)
        app.refresh_table()
        assert updates == [] and rebuilds == []
        run.emit(ev.RankProgressed(3, 31, 1200, {"loss": 2.1}, ev.ProgressSource.CHANNEL))
        app.refresh_table()
        assert updates == [("3", "progress")] and rebuilds == []


# ---------------------------------------------------------------------- key hints


async def test_key_hints_follow_the_phase(tmp_path: Path) -> None:
    def line(app: App[Any]) -> str:
        return region_text(app, app.query_one(KeyHints))[0]

    app, _, prepare = scripted_app("running")
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        assert app.query_one(KeyHints).phase == ("running", None)
        assert "c Cancel" in line(app) and "k Kill now" in line(app)
        assert "Save" not in line(app)
    app, _, prepare = scripted_app("cancelling")
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        assert app.query_one(KeyHints).phase == ("stopping", None)
        assert "c Kill now" in line(app) and "Cancel" not in line(app)
    app, _, prepare = scripted_app("crashed", envelope_dir=tmp_path)
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        assert app.query_one(KeyHints).phase == ("ended", 2)
        keys = line(app)
        assert "q Quit (exit 2)" in keys and "s Save envelope" in keys
        assert "Cancel" not in keys and "Kill" not in keys


async def test_key_hints_change_as_the_run_moves_on(tmp_path: Path) -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        keys = app.query_one(KeyHints)
        run.emit(ev.RunStopping(StopKind.CANCEL, "cancelled by operator", "operator", 30.0,
                                (0, 1), T0))
        await pilot.pause()
        assert keys.phase == ("stopping", None)
        assert [text for _, text in keys.keys if "Cancel" in text] == []
        run.finish(state_failed(ScriptedRun(8), FakeClock(), tmp_path))
        await pilot.pause()
        assert keys.phase == ("ended", 2)
        assert ("q", "Quit (exit 2)") in keys.keys


async def test_key_hints_leave_keys_off_whole() -> None:
    app, _, prepare = scripted_app("running")
    async with app.run_test(size=(40, 12)) as pilot:
        await prepare(pilot)
        keys = region_text(app, app.query_one(KeyHints))[0].strip()
        assert keys.startswith("c Cancel  k Kill now")
        texts = [f"{k} {t}" for k, t in app.query_one(KeyHints).keys]
        assert all(part in texts for part in keys.split("  "))


# ---------------------------------------------------------------------- dialogs


@pytest.mark.parametrize("size", [(40, 12), (60, 16), SMALL], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_confirm_dialog_shows_its_question_and_keys(size: tuple[int, int]) -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=size) as pilot:
        await prepare(pilot)
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmCancel)
        box = app.screen.query_one("#confirm-box")
        assert app.screen.region.contains_region(box.region)
        shown = "\n".join(region_text(app, box))
        assert "Stop the run?" in shown
        assert "Stop run (y)" in shown and "Keep running (n)" in shown, shown
        await pilot.press("y")
        assert run.commands == [("cancel", "operator")]


@pytest.mark.parametrize("size", [(40, 12), SMALL], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_help_fits_and_scrolls(size: tuple[int, int]) -> None:
    app, _, prepare = scripted_app("running")
    async with app.run_test(size=size) as pilot:
        await prepare(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one("#help-box")
        assert app.screen.region.contains_region(box.region)
        assert "forgelm-tui keys" in "\n".join(region_text(app, box))
        await pilot.press("end")
        await pilot.pause()
        assert "ctrl+p" in "\n".join(region_text(app, box))


# ---------------------------------------------------------------------- snapshots


def _snap(state: str, snap_compare: Any) -> None:
    app, _, prepare = scripted_app(state)
    assert snap_compare(app, terminal_size=SMALL, run_before=prepare)


def test_snapshot_running_80x24(snap_compare: Any) -> None:
    _snap("running", snap_compare)


def test_snapshot_cancelling_80x24(snap_compare: Any) -> None:
    _snap("cancelling", snap_compare)


def test_snapshot_crashed_80x24(snap_compare: Any) -> None:
    _snap("crashed", snap_compare)
