"""Where the ranks were stuck, in the TUI: `t` (and the palette's "Capture stacks") asks the
run for every rank's stacks; the verdict panel names each rank's innermost frame."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console
from scripted import ScriptedRun, pilot_wait_for
from scripted import scripted_app as make_app
from textual.command import CommandList, CommandPalette

from forgelm_tui.engine import events as ev
from forgelm_tui.tui.screens.stacks import stacks_notice
from forgelm_tui.tui.widgets.verdict_panel import verdict_renderable

pytestmark = pytest.mark.timeout(60)
SIZE = (170, 42)


class StacksRun(ScriptedRun):
    """A scripted run that can be asked for stacks, as the launching TUI's session can."""

    def request_stacks(self, origin: str = "operator") -> bool:
        self.commands.append(("stacks", origin))
        return True


def _notices(app: Any) -> list[str]:
    return [str(n.message) for n in app._notifications]


def _palette_offers(app: Any, command: str) -> bool:
    """The command palette is open with ``command`` highlighted (so enter runs it)."""
    if not isinstance(app.screen, CommandPalette):
        return False
    options = app.screen.query_one(CommandList)
    highlighted = options.highlighted
    return highlighted is not None and str(
        options.get_option_at_index(highlighted).prompt).startswith(command)


async def test_t_asks_the_run_for_every_rank_s_stacks_and_shows_where_they_are() -> None:
    app, run, prepare = make_app("running")
    app.run_handle = stacks_run = StacksRun(run.world_size)  # the same app, on a run with stacks
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("t")
        await pilot.pause()
        assert stacks_run.commands == [("stacks", "operator")]
        assert any("Capturing every live rank's stacks" in n for n in _notices(app))
        stacks_run.emit(ev.StacksCaptured("requested by operator", (
            ev.RankStacks(0, "/work/pkg/train.py:10 spin", "/runs/x/rank-0.stacks.txt",
                          "faulthandler"),
            ev.RankStacks(1, None, None, None, "it did not announce the handler"),
        ), 1.0, 0.2))
        await pilot.pause()
        shown = _notices(app)[-1]
        assert "rank 0: pkg/train.py:10 spin" in shown and "rank 1: no stacks" in shown
        assert "/runs/x/rank-N.stacks.txt" in shown


async def test_the_palette_has_capture_stacks_and_a_run_that_cannot_says_so() -> None:
    app, run, prepare = make_app("running")  # the scripted run starts no capture
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Capture stacks")
        await pilot_wait_for(pilot, lambda: _palette_offers(app, "Capture stacks"),
                             "the palette to offer Capture stacks")
        await pilot.press("enter")
        await pilot.pause()
        assert any(n.startswith("No capture started") for n in _notices(app))
        assert run.commands == [("stacks", "operator")]


def _text(envelope: dict[str, Any]) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(verdict_renderable(envelope, "/runs/x/envelope.json"))
    return console.export_text()


def _rank(rank: int, **fields: Any) -> dict[str, Any]:
    return {"rank": rank, "signal": "SIGTERM", "signalled_by_supervisor": True,
            "signals_sent": [], "forgelm_result": None, **fields}


def _stalled(**fields: Any) -> dict[str, Any]:
    """A stalled run's envelope, as the verdict panel reads it."""
    return {"exit_code": 2, "exit_name": "EXIT_TRAINING_ERROR", "exit_meaning": "runtime error",
            "ci_action": "investigate logs", "root_cause_rank": None, "disagreements": [],
            "decided_by": {"rule": 4, "explanation": "stalled: no rank made progress"},
            "stop": {"kind": "stall"}, **fields}


def test_the_verdict_names_where_each_rank_was_stuck() -> None:
    envelope = _stalled(
        ranks=[
            _rank(0, stuck_at="/work/pkg/train.py:10 spin",
                  stacks_file="/runs/x/rank-0.stacks.txt", stacks_via="faulthandler"),
            _rank(1, stuck_at=None, stacks_file=None, stacks_via=None,
                  stacks_note="it did not announce the handler; pip install ..."),
        ],
    )
    text = _text(envelope)
    assert "stuck at: rank 0 pkg/train.py:10 spin" in text  # in the summary, always shown
    assert "where each rank was stuck" in text
    assert "rank 0: /work/pkg/train.py:10 spin  (every thread: /runs/x/rank-0.stacks.txt)" in text
    assert "rank 1: no stacks: it did not announce the handler" in text
    plain = {**envelope, "stop": None, "ranks": [_rank(0), _rank(1)]}
    assert "stuck" not in _text(plain)  # no capture, nothing said


def test_the_notice_sanitises_what_came_from_a_rank() -> None:
    event = ev.StacksCaptured("requested by operator", (
        ev.RankStacks(0, "/x/\x1b[31mevil.py:1 f", "/r/rank-0.stacks.txt", "faulthandler"),), 0.0,
        0.1)
    assert "\x1b" not in stacks_notice(event)


def test_the_verdict_says_the_hang_in_one_sentence() -> None:
    """A stall's hang (engine/hang.py) in the verdict's summary, before where each rank was."""
    envelope = _stalled(
        hang={"collective": {"pg": "0", "seq": 1043, "op": "all_reduce", "op_from": "stacks"},
              "waiting_ranks": [0, 1, 2], "missing_ranks": [3], "mismatch": None,
              "other_groups": [], "trace_files": ["/runs/x/rank-3.stacks.txt"]},
        ranks=[_rank(r, stuck_at=f"/work/pkg/train.py:{r} step") for r in range(4)],
    )
    text = _text(envelope)
    assert ("hang: rank 3 never entered all_reduce #1043 of process group 0; ranks 0-2 wait in "
            "it") in text
    assert text.index("hang:") < text.index("stuck at:")
    assert "hang:" not in _text({**envelope, "hang": None})
