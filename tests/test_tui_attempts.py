"""The TUI across restarts: ``attempt 2/3`` in the run header, fresh rank rows per attempt,
and an attached viewer's snapshot carries the attempt."""

from __future__ import annotations

import pytest

from forgelm_tui.engine import events as ev
from forgelm_tui.tui.attempt import follow_attempts, restore
from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.widgets.run_header import fit_line, header_parts
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(10)


def _header(model: RunModel) -> str:
    return fit_line(header_parts(model, None), 200).plain


def test_the_header_shows_the_attempt_and_rows_start_afresh() -> None:
    model = RunModel("r1", ["forgelm-tui"], 2, clock=lambda: 10.0)
    apply = follow_attempts(model)
    apply(ev.AttemptStarted(0, 2, "", 0.0, 1.0))
    assert "attempt 1/3" in _header(model)
    apply(ev.RunStarted("r1", 2, ("python",), "/runs/r1", 1.0))
    apply(ev.RankStarted(1, 1, 4242, 1.5))
    apply(ev.RankExited(1, 7, None, False, 2.0))
    apply(ev.RunStopping(StopKind.FAILURE, "rank 1 failed (exit 7)", "failure", 5.0, (0,), 2.0))
    apply(ev.RunFinished(3.0))
    apply(ev.AttemptStarted(1, 2, "restarting after rank 1 failed (exit 7)", 1.0, 3.0))
    assert model.state == "starting" and model.stop is None and model.ended_at is None
    row = model.ranks[1]
    assert (row.pid, row.exit_code, row.ended_at) == (None, None, None)
    header = _header(model)
    assert "attempt 2/3" in header and "STARTING" in header
    assert model.notices[-1] == "attempt 2/3: restarting after rank 1 failed (exit 7)"
    apply(ev.RunStarted("r1", 2, ("python",), "/runs/r1/attempt-1", 4.0))
    assert model.state == "running" and "attempt 2/3" in _header(model)


def test_no_attempt_shown_without_restarts() -> None:
    model = RunModel("r1", ["forgelm-tui"], 1, clock=lambda: 10.0)
    assert "attempt" not in _header(model)


def test_a_late_viewer_restores_the_attempt() -> None:
    model = RunModel("r1", ["forgelm-tui"], 1, clock=lambda: 10.0)
    attempt = ev.AttemptStarted(2, 2, "restarting after a stall", 2.0, 9.0)
    restore(model, ev.RunSnapshot("r1", 1, ("python",), "/runs/r1/attempt-2", 9.5, (),
                                  attempt=attempt))
    assert model.attempt == attempt and "attempt 3/3" in _header(model)


def test_a_restart_on_several_nodes_starts_every_nodes_rows_afresh() -> None:
    """Node 0's TUI: its own rank and node 1's rank start again; the header says the nodes."""
    model = RunModel("r1", ["forgelm-tui"], 2, clock=lambda: 10.0)
    apply = follow_attempts(model)
    apply(ev.AttemptStarted(0, 1, "", 0.0, 1.0, nnodes=2))
    apply(ev.RunStarted("r1", 2, ("python",), "/runs/r1/node-0", 1.0, 0, 2))
    apply(ev.RankStarted(0, 0, 4242, 1.5))
    apply(ev.NodeChanged(1, "b", ev.NodeState.DONE, (), 2.5))
    model.ranks[1].exit_code, model.ranks[1].pid = 9, 777  # as node 1's view had said
    assert "attempt 1/2, 2 nodes" in _header(model)
    apply(ev.AttemptStarted(1, 1, "restarting after rank 1 failed (exit 9)", 0.2, 3.0, nnodes=2))
    assert [(r.rank, r.node_rank, r.pid, r.exit_code) for r in model.ranks.values()] == [
        (0, None, None, None), (1, 1, None, None)]
    assert model.notices[-1] == ("attempt 2/2, 2 nodes: restarting after rank 1 failed "
                                 "(exit 9)")
