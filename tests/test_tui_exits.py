"""Every way out of the launching TUI goes through one path, and a question always tells the
truth: one dialog at a time, closed when the state changes under it, never a stale escalation."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from scripted import T0, FakeClock, ScriptedRun, scripted_app, state_failed

from forgelm_tui.engine import events as ev
from forgelm_tui.tui.screens.confirm import ConfirmCancel
from forgelm_tui.tui.screens.forward import ConfirmForward
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(60)
SIZE = (120, 32)


def outside_stop(run: ScriptedRun) -> None:
    """What the engine sends when a SIGTERM to the supervisor starts the stop."""
    run.emit(ev.RunStopping(StopKind.CANCEL, "cancelled by SIGTERM to the supervisor",
                            "SIGTERM to the supervisor", run.grace, (0, 1), T0))


def dialogs(app: object) -> int:
    return sum(isinstance(s, ConfirmCancel) for s in app.screen_stack)  # type: ignore[attr-defined]


async def test_ctrl_q_mid_run_asks_and_quits_only_after_the_run(tmp_path: Path) -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("ctrl+q")
        assert isinstance(app.screen, ConfirmCancel) and app.is_running
        await pilot.press("n")
        assert run.commands == [] and app.is_running
        run.finish(state_failed(ScriptedRun(8), FakeClock(), tmp_path))
        await pilot.pause()
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_value == 2


async def test_ctrl_c_twice_is_one_dialog_confirmed_and_later_keys_do_not_kill() -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("ctrl+c", "ctrl+c")
        await pilot.pause()
        assert dialogs(app) == 0
        assert run.commands == [("cancel", "operator")]
        outside_stop(run)  # the engine's answer to the cancel
        await pilot.press("y", "y")
        await pilot.pause()
        assert run.commands == [("cancel", "operator")]  # no SIGKILL within the grace


async def test_a_stop_that_began_elsewhere_closes_the_question() -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("c")
        assert dialogs(app) == 1
        outside_stop(run)
        await pilot.pause()
        assert dialogs(app) == 0
        await pilot.press("y")
        await pilot.pause()
        assert run.commands == []


async def test_a_stale_yes_never_escalates() -> None:
    """Answered after the stop began (the close raced the key): the answer is dropped."""
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("c")
        question = app.screen
        assert isinstance(question, ConfirmCancel)
        app.model.apply(ev.RunStopping(StopKind.STALL, "stalled", "stall", 30.0, (0,), T0))
        question.action_confirm()
        await pilot.pause()
        assert run.commands == []


async def test_the_run_ending_under_a_question_closes_it(tmp_path: Path) -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("q")
        assert dialogs(app) == 1
        await pilot.press("q")  # asking already: no second dialog
        assert dialogs(app) == 1
        run.finish(state_failed(ScriptedRun(8), FakeClock(), tmp_path))
        await pilot.pause()
        assert dialogs(app) == 0
        assert app.query_one("#verdict").display


async def test_quit_while_stopping_waits_for_the_verdict() -> None:
    app, run, prepare = scripted_app("cancelling")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        for key in ("q", "ctrl+q"):
            await pilot.press(key)
            await pilot.pause()
            assert dialogs(app) == 0 and app.is_running
        assert run.commands == []
        await pilot.press("c")  # escalation is explicit
        assert run.commands == [("kill", "operator (second cancel)")]


async def test_the_palette_is_the_bindings_then_what_has_no_key() -> None:
    """Every bound action once, titled and explained as the key line and the help screen say
    it, with all its keys; then the commands no key has. A viewer's d (Detach) comes along."""
    from forgelm_tui.tui.app import PALETTE_ONLY, SupervisorApp
    from forgelm_tui.tui.attach import AttachApp

    app, _, _ = scripted_app("running")
    async with app.run_test(size=SIZE):
        screen = app.screen
    for cls in (SupervisorApp, AttachApp):
        app.BINDINGS = cls.BINDINGS  # type: ignore[misc]  # AttachApp's list, on this app
        commands = list(app.get_system_commands(screen))
        actions = list(dict.fromkeys(b.action for b in cls.BINDINGS))
        assert [c.title for c in commands] == [
            next(b.description for b in cls.BINDINGS if b.action == a) for a in actions
        ] + [title for title, _, _ in PALETTE_ONLY]
        by_title = {c.title: c for c in commands}
        assert by_title["Cancel"].help.startswith("c / ctrl+c · cancel the run")
        assert by_title["Capture stacks"].help.startswith("t · ")
        assert ("Detach" in by_title) == (cls is AttachApp)


async def test_palette_quit_takes_the_same_path() -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        await commands["Quit"].callback()  # run_action: a coroutine, awaited as the palette does
        await pilot.pause()
        assert dialogs(app) == 1 and app.is_running and run.commands == []


async def test_forwarding_warns_about_ranks_without_a_handler() -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        run.emit(ev.RankSampled(2, {"cpu": 50.0, "rss": 1 << 30, "children": 0}, 1.0,
                                caught_mask=1 << 11, ignored_mask=0))
        app.action_forward("SIGUSR1")
        await pilot.pause()
        question = app.screen
        assert isinstance(question, ConfirmForward)
        text = str(question.query_one("#confirm-text").render())
        assert "Rank 2 has no handler for SIGUSR1" in text
        await pilot.press("n")
        assert run.commands == []
        app.action_forward("SIGUSR1")
        await pilot.pause()
        await pilot.press("c")  # the stop question replaces it: one dialog at a time
        await pilot.pause()
        assert dialogs(app) == 1 and len(app.screen_stack) == 2
        assert not isinstance(app.screen, ConfirmForward)
        await pilot.press("n")
        app.action_forward("SIGUSR1")
        await pilot.pause()
        await pilot.press("ctrl+c")  # the same with ctrl+c
        await pilot.pause()
        assert dialogs(app) == 1 and len(app.screen_stack) == 2
        await pilot.press("n")
        app.action_forward("SIGUSR1")
        await pilot.pause()
        await pilot.press("y")
        assert run.commands == [("forward", "SIGUSR1")]
        app.action_forward("SIGUSR2")  # every rank handles it: no question
        await pilot.pause()
        assert run.commands[-1] == ("forward", "SIGUSR2")


def _highlighted(pane: object, y: int) -> str:
    from forgelm_tui.tui.widgets.log_pane import MATCH_STYLE

    strip = pane.render_line(y)  # type: ignore[attr-defined]
    return "".join(seg.text for seg in strip if seg.style and seg.style.bgcolor
                   and seg.style.bgcolor == MATCH_STYLE.bgcolor)


async def test_search_highlights_the_current_match_and_an_empty_search_clears() -> None:
    from textual.widgets import Static

    from forgelm_tui.tui.widgets.log_pane import LogPane

    app, run, prepare = scripted_app("running")
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        pane = app.query_one(LogPane)
        filler = tuple(f"filler line {i}" for i in range(300))
        run.emit(ev.RankOutput.of(0, "stdout", (*filler[:100], "x" * 300 + " NEEDLE here",
                                                *filler[100:])))
        app.flush_logs()
        await pilot.pause()
        await pilot.press("slash", *"needle", "enter")
        await pilot.pause()
        title = str(app.query_one("#log-title", Static).render())
        assert "'needle': 1/1" in title
        match = pane.matches[0]
        top = int(pane.scroll_y)
        assert top <= match < top + pane.scrollable_content_region.height  # scrolled to it
        assert pane.scroll_x > 0  # ...and sideways: the match is past the pane's width
        assert _highlighted(pane, match - top) == "NEEDLE"
        await pilot.press("slash", *["backspace"] * 6, "enter")  # an empty search
        await pilot.pause()
        assert pane.query_text == "" and pane.matches == []
        assert "needle" not in str(app.query_one("#log-title", Static).render())
        assert _highlighted(pane, match - int(pane.scroll_y)) == ""


async def test_the_countdown_names_only_live_ranks_singular_and_plural() -> None:
    from forgelm_tui.engine.events import RankState
    from forgelm_tui.tui.widgets.run_header import RunHeader

    app, run, prepare = scripted_app("running")
    async with app.run_test(size=(150, 40)) as pilot:
        await prepare(pilot)
        run.emit(ev.RunStopping(StopKind.CANCEL, "cancelled by operator", "operator", 30.0,
                                tuple(range(8)), T0 + 97))
        for rank in range(6):
            run.emit(ev.RankExited(rank, None, signal.SIGTERM, True, T0 + 98),
                     ev.RankStateChanged(rank, RankState.KILLED))
        app.refresh_table()
        await pilot.pause()
        header = str(app.query_one(RunHeader).render())
        assert "(ranks 6,7 left)" in header, header
        run.emit(ev.RankExited(6, None, signal.SIGTERM, True, T0 + 99))
        app.refresh_table()
        await pilot.pause()
        header = str(app.query_one(RunHeader).render())
        assert "(rank 7 left)" in header, header
