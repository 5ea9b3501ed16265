"""Many ranks (issue 23): a multi-node run with more ranks than the screen has rows shows a row
per node, opens a node's ranks on enter, and shows the ranks that need reading under their node
whether it is open or not (tui/node_groups.py)."""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

import pytest
from scripted import NODES, PER_NODE, T0, FakeClock, scripted_app
from test_tui_small import region_text

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import Purpose, RankState
from forgelm_tui.tui import node_groups as groups
from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.widgets.log_pane import LogPane
from forgelm_tui.tui.widgets.rank_table import RankTable

pytestmark = pytest.mark.timeout(60)
SMALL = (80, 24)


def table_rows(app: Any) -> list[str]:
    """The table's rows on screen (its header and bottom border left out), stripped."""
    return [row.strip(" ▇▁▂▃▄▅▆█") for row in region_text(app, app.query_one(RankTable))[1:-1]]


async def open_row(pilot: Any, app: Any, key: str) -> None:
    table = app.query_one(RankTable)
    table.move_cursor(row=table.get_row_index(key))
    await pilot.press("enter")
    await pilot.pause()


async def test_16_nodes_of_8_at_80x24_show_every_node_row_and_open_one() -> None:
    app, _, prepare = scripted_app("nodes")
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        rows = table_rows(app)
        assert [r.split()[2] for r in rows if r.startswith("▸")] == [str(n) for n in range(NODES)]
        assert len(rows) == NODES + 1, rows  # nothing scrolled out: the nodes and rank 77
        failed = rows.index(next(r for r in rows if r.startswith("77 ")))
        assert rows[failed - 1].startswith("▸ node 9") and "7 stop 1 fail" in rows[failed - 1]
        assert "2 TRAINING_ERROR" in rows[failed]
        assert "605/1200" in next(r for r in rows if r.startswith("▸ node 13 "))

        await open_row(pilot, app, "n3")
        table = app.query_one(RankTable)
        keys = [key.value for key in table.rows]
        at = keys.index("n3")
        assert keys[at + 1: at + 1 + PER_NODE] == [str(r) for r in range(24, 32)]
        assert table.selected_node() == 3  # the cursor stays on the node it opened
        assert app.query_one(LogPane).rank is None  # a node's row is no rank: the log stays
        assert any(r.startswith("▾ node 3") for r in table_rows(app))
        await pilot.press("down", "enter")  # enter on rank 24: its log
        await pilot.pause()
        assert app.query_one(LogPane).rank == 24
        await pilot.press("up", "enter")  # the node again: closed
        await pilot.pause()
        assert [key.value for key in table.rows].count("24") == 0


async def test_a_new_order_of_rows_keeps_the_table_where_it_was_scrolled() -> None:
    """Opening a node rebuilds the table: the cursor stays on its row, the view does not jump
    back to the top (the rows above did not change)."""
    app, _, prepare = scripted_app("nodes")
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        await open_row(pilot, app, "n13")  # 25 rows: the table scrolls
        table = app.query_one(RankTable)
        table.scroll_to(y=table.max_scroll_y, animate=False)
        await pilot.pause()
        scrolled = table.scroll_y
        assert scrolled > 0 and table.selected_node() == 13  # on screen, mid-table
        table.toggle_node(14)  # rows inserted below the cursor: a rebuild
        await pilot.pause()
        assert table.scroll_y == scrolled
        assert table.selected_node() == 13


async def test_a_screen_taller_than_the_ranks_shows_every_rank() -> None:
    app, _, prepare = scripted_app("nodes")
    async with app.run_test(size=(120, 140)) as pilot:
        await prepare(pilot)
        table = app.query_one(RankTable)
        assert not table.grouped
        assert [key.value for key in table.rows] == [str(r) for r in range(NODES * PER_NODE)]


def test_snapshot_nodes(snap_compare: Any) -> None:
    app, _, prepare = scripted_app("nodes")
    assert snap_compare(app, terminal_size=SMALL, run_before=prepare)


def test_snapshot_nodes_one_open(snap_compare: Any) -> None:
    app, _, prepare = scripted_app("nodes")

    async def opened(pilot: Any) -> None:
        await prepare(pilot)
        await open_row(pilot, app, "n13")

    assert snap_compare(app, terminal_size=SMALL, run_before=opened)


# ---------------------------------------------------------------------- the rules, in-process


def _model(nnodes: int = 4, per_node: int = 2) -> RunModel:
    model = RunModel("r", ["x"], nnodes * per_node, FakeClock())
    model.apply(ev.RunStarted("r", nnodes * per_node, ("x",), "/runs/x", T0, 0, nnodes))
    return model


def _snap(rank: int, node: int, state: RankState, *, code: int | None = None,
          sig: int | None = None, sent: tuple[ev.SignalSent, ...] = ()) -> ev.RankSnapshot:
    return ev.RankSnapshot(rank, rank % 2, node, 100 + rank, state, T0, None if code is None
                           and sig is None else T0 + 9, code, sig, sent, "", None, 5, 10, {},
                           None, {})


STOP = ev.SignalSent(signal.SIGTERM, T0 + 8, "rank 3 failed (exit 2)", Purpose.STOP)


@pytest.mark.parametrize(("snap", "shown"), [
    (_snap(3, 1, RankState.FAILED, code=2), True),  # failed on its own
    (_snap(3, 1, RankState.FAILED, code=1, sent=(STOP,)), False),  # the stop's collateral
    (_snap(3, 1, RankState.KILLED, sig=signal.SIGTERM, sent=(STOP,)), False),  # stopped
    (_snap(3, 1, RankState.KILLED, sig=signal.SIGKILL), True),  # the OOM killer, not us
    (_snap(3, 1, RankState.STOPPING, sent=(STOP,)), False),  # a stop signals every rank
    (_snap(3, 1, RankState.QUIET), False),
    (_snap(3, 1, RankState.EXITED, code=0), False),
], ids=["failed", "collateral", "stopped", "foreign-kill", "stopping", "quiet", "exited"])
def test_which_ranks_show_under_a_closed_node(snap: ev.RankSnapshot, shown: bool) -> None:
    model = _model()
    model.apply(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (snap,), T0))
    assert groups.notable(model, model.ranks[3]) is shown
    (_, under_node_0), (node1, under_node_1), *_ = groups.group_rows(model, set())
    assert node1.node == 1 and [r.rank for r in node1.rows] == [2, 3]
    assert [r.rank for r in under_node_1] == ([3] if shown else []) and under_node_0 == []


def test_a_stalled_rank_and_the_root_cause_show_under_their_closed_node() -> None:
    model = _model()
    model.apply(ev.RunStalled(600.0, (5,)))
    assert groups.notable(model, model.ranks[5])
    assert not groups.notable(model, model.ranks[4])
    assert [r.rank for _, under in groups.group_rows(model, set()) for r in under] == [5]
    assert [r.rank for _, under in groups.group_rows(model, {2}) for r in under] == [4, 5]


def test_the_ended_hangs_missing_rank_shows_under_its_closed_node() -> None:
    """A stall on several nodes: the rank the hang names as never having entered the
    collective (here on node 3, a row another node sent) shows once the run has ended; the
    ranks that waited in it do not (every rank is stalled: they would be every row)."""
    model = _model()
    model.apply(ev.NodeChanged(3, "d", ev.NodeState.DONE, (
        _snap(6, 3, RankState.KILLED, sig=signal.SIGTERM, sent=(STOP,)),
        _snap(7, 3, RankState.KILLED, sig=signal.SIGTERM, sent=(STOP,))), T0))
    assert not groups.notable(model, model.ranks[7])
    model.finished({"hang": {"missing_ranks": [7], "waiting_ranks": [0, 1, 2, 3, 4, 5, 6]}})
    assert model.state == "finished" and model.hang_missing == {7}
    assert groups.notable(model, model.ranks[7]) and not groups.notable(model, model.ranks[6])
    assert [r.rank for _, under in groups.group_rows(model, set()) for r in under] == [7]
    model.finished({"hang": None})
    assert model.hang_missing == set()


def test_a_node_row_counts_states_and_names_the_slowest_and_the_longest_wait() -> None:
    model = _model()
    clock = model.clock
    assert isinstance(clock, FakeClock)
    running = _snap(2, 1, RankState.RUNNING)
    for step in (5, 6):
        model.apply(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (
            running, ev.RankSnapshot(3, 1, 1, 103, RankState.RUNNING, T0, None, None, None, (),
                                     "", None, step, 10, {}, None, {})), T0))
        clock.advance(4)
    view = groups.group_rows(model, set())[1][0]
    assert view.summary.slowest is not None and view.summary.slowest[0] == 2
    assert groups.progress_text(view) == "5/10 ·8s"  # rank 2 stood at step 5 for 8 s
    assert groups.state_cell(view, {"running": "green"}) == ("2 running", "green")
    model.apply(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (
        _snap(2, 1, RankState.FAILED, code=2), _snap(3, 1, RankState.STOPPING, sent=(STOP,))),
        T0))
    view = groups.group_rows(model, set())[1][0]
    assert groups.state_cell(view, {"failed": "bold red"}) == ("1 stop 1 fail", "bold red")
    assert groups.exit_cell(view) == ("2 TRAINING_ERROR", "bold red")
    assert groups.signal_cell(view) == ("SIGTERM ×1", "magenta")


def test_one_node_or_few_ranks_never_group() -> None:
    assert not groups.grouped(_model(1, 64), 24)  # one node: rank rows, scrolled
    assert not groups.grouped(_model(4, 2), 24)
    assert groups.grouped(_model(4, 8), 24)
    assert not groups.grouped(_model(4, 8), 0)  # not laid out yet



def test_a_node_row_counts_its_gpus_averages_their_use_and_shows_its_fullest_rank() -> None:
    from scripted_gpu import MEMORY, devices, sample

    model = _model(4, 2)  # this node's ranks 0 and 1 on devices 0 and 1
    for rank in (0, 1):
        model.apply(ev.RankStarted(rank, rank, 100 + rank, T0))
    model.apply(sample(devices(2), {0: 0, 1: 1}, MEMORY))
    view = groups.group_rows(model, set())[0][0]
    assert view.gpu["gpu"] == ("2", "")
    assert view.gpu["gpu_util"] == (" 95.5", "")  # 97 and 94
    text, _ = view.gpu["gpu_mem"]
    assert text.endswith("34.0/80.0G")  # rank 1's 34 GiB: the fuller of the two
    assert groups.group_rows(model, set())[1][0].gpu["gpu"] == ("-", "")  # node 1: no sample


def test_a_node_known_by_its_summary_shows_it_and_only_its_ranks_that_need_reading() -> None:
    """A node no view here opened sends its row only (cluster/views.py): its cells come from
    its own summary, grown by the time since it came; its failed rank still shows under it."""
    from forgelm_tui.engine.node_summary import RankFacts, summarise

    model = _model()
    clock = model.clock
    assert isinstance(clock, FakeClock)
    failed = _snap(3, 1, RankState.FAILED, code=2)
    summary = summarise([RankFacts(2, RankState.RUNNING, True, 40, 100, step_age=3.0,
                                   output_age=1.0),
                         RankFacts(3, RankState.FAILED, False, 41, 100, exit_code=2)])
    model.apply(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (failed,), T0, summary, False))
    clock.advance(4.0)
    view, under = groups.group_rows(model, set())[1]
    assert [r.rank for r in under] == [3]
    assert groups.state_cell(view, {"failed": "bold red"}) == ("1 run 1 fail", "bold red")
    assert groups.progress_text(view) == "40/100 ·7s"  # 3 s when sent, 4 s since
    assert groups.output_age(view) == ("5s", "")
    assert groups.exit_cell(view) == ("2 TRAINING_ERROR", "bold red")
    assert groups.bar_of(view) == ("0.4000", "")
    assert model.ranks[2].state is RankState.STARTING  # its details never came: not made up


async def test_the_table_shows_every_nodes_ranks_or_those_it_opened_and_the_app_says_so() -> None:
    from forgelm_tui.engine.node_summary import Watch

    app, _, prepare = scripted_app("nodes")
    async with app.run_test(size=SMALL) as pilot:
        await prepare(pilot)
        assert app.watching() == Watch(True, frozenset())  # grouped, nothing opened
        await open_row(pilot, app, "n3")
        app.refresh_table()
        assert app.watching() == Watch(True, frozenset({3}))
    app, _, prepare = scripted_app("nodes")
    async with app.run_test(size=(120, 140)) as pilot:
        await prepare(pilot)
        assert app.watching() == Watch(True, None)  # every rank listed: every node


def test_a_closed_nodes_ranks_are_not_kept_frozen() -> None:
    """A node closed again sends its row only: its ranks' rows go back to what this view
    knows of them (nothing), not their last details frozen (the header's pace would read a
    rate of 0 from them), but for those its row still carries."""
    from forgelm_tui.engine.node_summary import RankFacts, summarise
    from forgelm_tui.tui.progress_view import run_pace

    model = _model()
    clock = model.clock
    assert isinstance(clock, FakeClock)
    for step in (5, 6, 7):
        model.apply(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (
            dataclasses.replace(_snap(2, 1, RankState.RUNNING), step=step),
            dataclasses.replace(_snap(3, 1, RankState.RUNNING), step=step)), clock()))
        clock.advance(1.0)
    assert model.ranks[2].step == 7 and run_pace(model.ranks.values(), clock()) is not None
    summary = summarise([RankFacts(2, RankState.RUNNING, True, 9, 10)])
    failed = _snap(3, 1, RankState.FAILED, code=2)
    model.apply(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (failed,), clock(), summary,
                               complete=False))
    assert model.ranks[2].step is None and model.ranks[2].node_rank == 1
    assert model.ranks[3].state is RankState.FAILED
    clock.advance(60.0)
    assert run_pace(model.ranks.values(), clock()) is None  # nothing frozen read as stopped


class RecordingClient:
    """A control client whose snapshot is given and which keeps what the viewer sends."""

    path, supervisor_pid = None, None

    def __init__(self, nnodes: int) -> None:
        self.snapshot = ev.RunSnapshot("r", 4 * nnodes, ("x",), "/runs/x", None, (),
                                       node_rank=0, nnodes=nnodes)
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def next_item(self) -> ev.RunSnapshot:
        return self.snapshot

    def send(self, kind: str, via: str = "terminal", **fields: Any) -> None:
        self.sent.append((kind, fields))


@pytest.mark.parametrize(("nnodes", "said"), [(2, [("watch", {"nodes": None})]), (1, [])])
async def test_an_attached_viewer_tells_the_run_which_nodes_it_shows(
        nnodes: int, said: list[tuple[str, dict[str, Any]]]) -> None:
    """A multi-node run's attached TUI says ``watch`` (docs/control.md) when what it shows
    changes: every node while it lists every rank; nothing is said for one node."""
    from forgelm_tui.tui.attach import AttachApp, AttachedRun

    client = RecordingClient(nnodes)
    handle = AttachedRun(client)  # type: ignore[arg-type]
    app = AttachApp(handle, clock=FakeClock(), auto_start=False)
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        app.refresh_table()
        app.refresh_table()  # unchanged: said once
    assert client.sent == said
