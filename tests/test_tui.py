"""The TUI driven by a scripted run: every action and state, plus snapshots of the key states."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from scripted import FakeClock, ScriptedRun, scripted_app
from textual.pilot import Pilot
from textual.widgets import Static

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import RankState
from forgelm_tui.tui.app import SupervisorApp
from forgelm_tui.tui.screens.confirm import ConfirmCancel
from forgelm_tui.tui.widgets.log_pane import LogPane
from forgelm_tui.tui.widgets.rank_table import RankTable
from forgelm_tui.tui.widgets.run_header import RunHeader
from forgelm_tui.tui.widgets.verdict_panel import VerdictPanel

pytestmark = pytest.mark.timeout(60)
SIZE = (170, 42)


Prepare = Callable[[Pilot[Any]], Awaitable[None]]


def make(state: str, tmp_path: Path | None = None) -> tuple[SupervisorApp, ScriptedRun, Prepare]:
    save = None
    if tmp_path is not None:
        save = tmp_path / "downloads"
        save.mkdir(exist_ok=True)
    app, run, prepare = scripted_app(state, envelope_dir=tmp_path, save_directory=save)
    return app, run, prepare


def feed(app: SupervisorApp, run: ScriptedRun, rank: int, lines: Iterable[str]) -> None:
    """One output event from ``rank``, then one log flush: what the 10 Hz timer would do."""
    run.emit(ev.RankOutput.of(rank, "stdout", tuple(lines)))
    app.flush_logs()


def bottom_line(pane: LogPane) -> str:
    return pane.render_line(pane.scrollable_content_region.height - 1).text


def panel_text(app: SupervisorApp) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(app.query_one(VerdictPanel).shown)
    return console.export_text()


async def test_running_shows_every_rank_and_the_quiet_one() -> None:
    app, _, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        table = app.query_one(RankTable)
        assert table.row_count == 8
        assert str(table.get_cell("5", "state")) == "quiet"
        assert str(table.get_cell("0", "state")) == "running"
        assert "loss" in str(table.get_cell("0", "last"))
        assert len(app.query_one(LogPane).lines) == 7 * 3 + 1  # rank 5 is quiet


async def test_cancel_asks_first_then_stops() -> None:
    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmCancel)
        await pilot.press("n")
        assert run.commands == []
        await pilot.press("ctrl+c")
        assert isinstance(app.screen, ConfirmCancel)
        await pilot.press("y")
        await pilot.pause()
        assert run.commands == [("cancel", "operator")]


async def test_second_cancel_and_k_kill_now() -> None:
    app, run, prepare = make("cancelling")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        header = str(app.query_one(RunHeader).render())
        assert "STOPPING" in header and "SIGKILL in 24 s" in header
        assert str(app.query_one(RankTable).get_cell("3", "state")) == "stopping"
        assert "operator cancel" in str(app.query_one(RankTable).get_cell("0", "signal"))
        await pilot.press("c")
        await pilot.press("k")
        assert run.commands == [("kill", "operator (second cancel)"), ("kill", "operator")]


async def test_palette_forwards_signals() -> None:
    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Forward SIGUSR2")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert run.commands == [("forward", "SIGUSR2")]


async def test_failed_verdict_names_the_root_cause(tmp_path: Path) -> None:
    app, _, prepare = make("failed", tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        text = panel_text(app)
        assert "exit 2 TRAINING_ERROR" in text
        assert "rule 2: root cause: rank 1 failed on its own (exit 2)" in text
        assert "RuntimeError: CUDA out of memory" in text
        assert "investigate logs" in text
        assert str(tmp_path / "envelope.json") in text


async def test_approval_verdict_then_q_exits_with_4(tmp_path: Path) -> None:
    app, _, prepare = make("approval", tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        text = panel_text(app)
        assert "exit 4 AWAITING_APPROVAL" in text
        assert "request review" in text
        assert "staged at: /jobs/tiny/out/final_model.staging.fg-5d1cf2f73980" in text
        assert "forgelm approve fg-5d1cf2f73980 --output-dir /jobs/tiny/out" in text
        await pilot.press("q")
    assert app.return_code == 4 or app.return_value == 4


async def test_save_writes_the_same_envelope(tmp_path: Path) -> None:
    app, _, prepare = make("approval", tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("s")
        assert app.saved_to is not None
        saved = Path(app.saved_to)
        for _ in range(100):
            if saved.exists():
                break
            await pilot.pause(0.05)
        assert saved.read_bytes() == (tmp_path / "envelope.json").read_bytes()


async def test_q_during_run_asks_to_cancel_first() -> None:
    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmCancel)
        await pilot.press("escape")
        assert app.is_running and run.commands == []


async def test_search_follow_and_rank_views() -> None:
    app, _, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("slash", *"'step': 20", "enter")
        await pilot.pause()
        title = str(app.query_one("#log-title", Static).render())
        assert "1/7" in title, title
        await pilot.press("n")
        assert "2/7" in str(app.query_one("#log-title", Static).render())
        await pilot.press("N")
        assert "1/7" in str(app.query_one("#log-title", Static).render())
        assert "paused" in str(app.query_one("#log-title", Static).render())
        await pilot.press("f")
        assert "following" in str(app.query_one("#log-title", Static).render())
        await pilot.press("down", "down", "enter")
        pane = app.query_one(LogPane)
        assert pane.rank == 2
        assert all(line.startswith("[rank 2]") for line in pane.lines)
        await pilot.press("a")
        assert pane.rank is None


async def test_child_text_is_never_markup() -> None:
    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        run.emit(ev.RankOutput.of(0, "stdout", ("[bold]not bold[/] [rank0] [/]",)))
        app.refresh_table()
        app.flush_logs()
        await pilot.pause()
        shown = str(app.query_one(RankTable).get_cell("0", "last"))
        assert shown == "[bold]not bold[/] [rank0] [/]"
        assert app.query_one(LogPane).lines[-1] == "[rank 0] [bold]not bold[/] [rank0] [/]"


async def test_scrolling_up_pauses_the_log_and_the_end_resumes_it() -> None:
    app, run, prepare = make("running")
    title = lambda: str(app.query_one("#log-title", Static).render())  # noqa: E731
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        pane = app.query_one(LogPane)
        feed(app, run, 0, (f"old {i}" for i in range(300)))
        pane.focus()
        await pilot.pause()
        await pilot.press("pageup")
        assert "paused" in title() and not pane.auto_scroll
        top = pane.render_line(0).text
        feed(app, run, 1, ["new line"])
        await pilot.pause()
        assert pane.render_line(0).text == top  # the reader's page stays still
        await pilot.press("end")
        assert "following" in title() and pane.auto_scroll
        feed(app, run, 1, ["newest line"])
        await pilot.pause()
        assert pane.is_vertical_scroll_end
        assert bottom_line(pane).startswith("[rank 1] newest line"), bottom_line(pane)


async def test_log_pane_edges_scroll_selection_resize_and_view_switch() -> None:
    from textual.geometry import Offset
    from textual.selection import Selection

    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        pane = app.query_one(LogPane)
        # Switching view after scrolling right along long lines starts at column 0 again.
        feed(app, run, 0, ["x" * 300] * 5)
        pane.scroll_to(x=200, animate=False, immediate=True)
        await pilot.press("a")
        assert pane.scroll_x == 0
        # Lines still queued for the next flush when the view is rebuilt show once.
        run.emit(ev.RankOutput.of(3, "stdout", ("queued once",)))
        await pilot.press("a")
        app.flush_logs()
        await pilot.pause()
        assert sum(line.endswith("queued once") for line in pane.lines) == 1
        # A selection is line numbers: pruning drops it instead of shifting it onto other lines.
        app.screen.selections = {pane: Selection(Offset(0, 2), Offset(5, 3))}
        assert pane.text_selection is not None
        for flush in range(25):
            feed(app, run, 1, (f"p{flush}-{i}" for i in range(900)))
        await pilot.pause()
        assert pane.text_selection is None
        # A pane that shrinks while following keeps the newest line at its bottom.
        await pilot.resize_terminal(SIZE[0], SIZE[1] - 12)
        await pilot.pause()
        assert pane.is_vertical_scroll_end


async def test_raw_hostile_chunk_shows_as_plain_text() -> None:
    """The engine hands the view raw bytes; what the pane and the table show is sanitised."""
    raw = (b"\x1b[31mred\x1b[0m plain\nprogress 10%\rprogress 100%\n"
           b"\x1b]0;title\x07osc gone\n[bold]x[/] \x1b[2J\x1b[Hcleared?")
    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        run.emit(ev.RankOutput(2, "stdout", raw))
        app.refresh_table()
        app.flush_logs()
        await pilot.pause()
        assert list(app.query_one(LogPane).lines[-4:]) == [
            "[rank 2] red plain", "[rank 2] progress 100%", "[rank 2] osc gone",
            "[rank 2] [bold]x[/] cleared?"]
        assert str(app.query_one(RankTable).get_cell("2", "last")) == "[bold]x[/] cleared?"


async def test_flood_is_bounded_per_flush() -> None:
    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        for chunk in range(200):
            run.emit(ev.RankOutput.of(chunk % 8, "stdout", tuple(f"line {chunk}-{i}" for i in
                                                             range(500))))
        app.flush_logs()
        await pilot.pause()
        lines = app.query_one(LogPane).lines
        assert len(lines) <= 7 * 3 + 1 + 4_001
        assert any("lines not shown here" in line for line in lines)
        assert lines[-1] == "[rank 7] line 199-499"


async def test_a_rank_ending_shows_without_waiting_for_the_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from forgelm_tui.tui import app as app_module

    monkeypatch.setattr(app_module, "TABLE_HZ", 1 / 3600)  # the periodic refresh never comes
    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        table = app.query_one(RankTable)
        run.emit(ev.RankOutput.of(3, "stdout", ("a line the tick would show",)))
        await pilot.pause()
        assert "a line the tick" not in str(table.get_cell("3", "last"))  # output waits
        run.emit(ev.RankExited(3, 4, None, False, 0.0), ev.RankStateChanged(3, RankState.EXITED))
        await pilot.pause()
        assert str(table.get_cell("3", "exit")) == "4 AWAITING_APPROVAL"
        assert str(table.get_cell("3", "state")) == "exited"
        assert "a line the tick" in str(table.get_cell("3", "last"))  # one repaint, all rows


async def test_log_growth_never_reflows_the_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Filling the history costs no layout pass (each one re-renders the whole screen), and
    following keeps the newest line at the bottom, scrollbar included."""
    from textual.screen import Screen

    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        pane = app.query_one(LogPane)
        layouts: list[object] = []
        original = Screen._refresh_layout
        monkeypatch.setattr(Screen, "_refresh_layout",
                            lambda screen, *a, **k: layouts.append(a) or original(screen, *a, **k))
        for flush in range(30):
            feed(app, run, flush % 8, (f"flush {flush} line {i}" for i in range(900)))
            await pilot.pause()
        assert layouts == []
        assert len(pane.lines) == pane.max_lines
        assert pane.virtual_size.height == pane.max_lines
        assert pane.vertical_scrollbar.window_virtual_size == pane.max_lines
        assert pane.is_vertical_scroll_end
        assert bottom_line(pane).startswith("[rank 5] flush 29 line 899"), bottom_line(pane)


async def test_a_paused_log_keeps_its_lines_in_view() -> None:
    app, run, prepare = make("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        pane = app.query_one(LogPane)
        for flush in range(25):
            feed(app, run, 0, (f"a{flush}-{i}" for i in range(900)))
        await pilot.press("f")  # pause
        pane.scroll_to(y=pane.max_scroll_y - 5000, animate=False, immediate=True)
        await pilot.pause()
        top = pane.render_line(0).text
        for flush in range(3):  # 2700 more lines: 2700 of the oldest go
            feed(app, run, 1, (f"b{flush}-{i}" for i in range(900)))
        await pilot.pause()
        assert pane.render_line(0).text == top
        assert pane.lines[-1] == "[rank 1] b2-899"
        await pilot.press("f")  # follow again: back to the newest line
        await pilot.pause()
        assert pane.is_vertical_scroll_end


async def test_a_cancel_by_signal_exits_after_the_run(tmp_path: Path) -> None:
    app, run, prepare = make("running")
    run.by_signal = True
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        from scripted import state_failed

        ending = state_failed(ScriptedRun(4), FakeClock(), tmp_path)
        run.finish(ending)
        await pilot.pause(0.2)
    assert app.return_value == 2


def _snap(state: str, snap_compare: Any, tmp_path: Path) -> None:
    app, _, prepare = make(state, None)
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare)


def test_snapshot_running(snap_compare: Any, tmp_path: Path) -> None:
    _snap("running", snap_compare, tmp_path)


def test_snapshot_cancelling(snap_compare: Any, tmp_path: Path) -> None:
    _snap("cancelling", snap_compare, tmp_path)


def test_snapshot_failed(snap_compare: Any, tmp_path: Path) -> None:
    _snap("failed", snap_compare, tmp_path)


def test_snapshot_approval(snap_compare: Any, tmp_path: Path) -> None:
    _snap("approval", snap_compare, tmp_path)


def test_snapshot_hung(snap_compare: Any, tmp_path: Path) -> None:
    """A stall whose hang is named: the verdict says it in one sentence (issue 22)."""
    _snap("hung", snap_compare, tmp_path)
