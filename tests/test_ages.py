"""A rank's output and progress ages: one definition each, the engine's and the views' alike."""

from __future__ import annotations

import pytest
from conftest import rank_record

from forgelm_tui.engine import ages

pytestmark = pytest.mark.timeout(10)


def test_output_age_counts_from_the_last_output_else_the_start_and_ends_with_the_rank() -> None:
    assert ages.output_age(10.0, None, None) is None  # not started
    assert ages.output_age(10.0, None, 4.0) == 6.0  # silent since its start
    assert ages.output_age(10.0, 7.5, 4.0) == 2.5
    assert ages.output_age(10.0, 7.5, 4.0, ended=9.0) is None  # ended: no age
    assert ages.output_age(10.0, 11.0, 4.0) == 0.0  # another clock a little ahead: never < 0


def test_progress_age_counts_from_the_last_progress() -> None:
    assert ages.progress_age(10.0, None) == 0.0
    assert ages.progress_age(10.0, 4.0) == 6.0


def test_the_record_and_the_table_read_the_same_ages() -> None:
    from forgelm_tui.engine import events as ev
    from forgelm_tui.tui.model import RunModel

    record = rank_record(0)
    record.mark_started(1234)
    assert record.started_mono is not None and record.started_at is not None
    record.last_output_mono, record.last_output_at = record.started_mono + 3, record.started_at + 3
    record.last_progress_mono = record.started_mono + 1
    assert record.output_age(record.started_mono + 5) == pytest.approx(2.0)
    assert record.progress_age(record.started_mono + 5) == pytest.approx(4.0)
    model = RunModel("r", ["x"], 1, lambda: record.started_at + 5)  # type: ignore[operator]
    model.restore(ev.RunSnapshot("r", 1, ("x",), "/runs/x", record.started_at,
                                 (record.snapshot(),), None, None))
    assert model.output_age(model.ranks[0]) == pytest.approx(2.0)
    record.mark_exit(0)
    assert record.output_age(record.started_mono + 6) is None
