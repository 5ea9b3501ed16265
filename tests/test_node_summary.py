"""A node's ranks summed up in a fixed size (engine/node_summary.py, issue 23): what a node's
row in a grouped view shows, made by the node itself from its records, or by a view from its
rows; and what the views on a node show of the others (``Watch``)."""

from __future__ import annotations

import signal

import pytest
from conftest import rank_record

from forgelm_tui.engine.events import GpuDevice, RankGpu, RankState
from forgelm_tui.engine.node_summary import (
    EVERY_RANK,
    NOTHING,
    RankFacts,
    Watch,
    summarise,
)
from forgelm_tui.engine.records import Evidence

pytestmark = pytest.mark.timeout(10)
GIB = 1 << 30


def gpu(index: int, util: float, used: int) -> RankGpu:
    device = GpuDevice(index, f"GPU-{index}", "H100", util, used * GIB, 80 * GIB)
    return RankGpu(index, (device,), used * GIB)


def test_states_are_counted_the_slowest_named_and_only_live_ranks_wait() -> None:
    summary = summarise([
        RankFacts(3, RankState.RUNNING, True, 40, 100, step_age=2.0, output_age=1.0),
        RankFacts(1, RankState.RUNNING, True, 38, 100, step_age=7.5, output_age=0.5),
        RankFacts(2, RankState.QUIET, True, 38, 100, step_age=30.0, output_age=30.0),
        RankFacts(0, RankState.EXITED, False, 10, 100, step_age=900.0, output_age=900.0,
                  exit_code=0),
    ])
    assert summary.ranks == 4
    assert (summary.count(RankState.RUNNING), summary.count(RankState.QUIET),
            summary.count(RankState.EXITED), summary.count(RankState.FAILED)) == (2, 1, 1, 0)
    assert summary.slowest == (0, 10, 100)  # the ended rank's step still counts as slowest
    assert (summary.step_wait, summary.output_age) == (30.0, 30.0)  # live ranks only
    assert summary.exit_code is None  # ranks still run


@pytest.mark.parametrize(("codes", "expected"), [
    ((0, 0, 0), 0), ((0, 2, 4), 2), ((None, 0, 0), None), ((0, 0, 4), 4),
])
def test_the_exit_is_the_first_failing_ranks_or_0_once_every_rank_exited_0(
        codes: tuple[int | None, ...], expected: int | None) -> None:
    facts = [RankFacts(r, RankState.EXITED, code is None, exit_code=code)
             for r, code in enumerate(codes)]
    assert summarise(facts).exit_code == expected


def test_the_stop_signal_most_ranks_were_sent_last_and_how_many() -> None:
    facts = [RankFacts(r, RankState.STOPPING, True, stop_signal=sig)
             for r, sig in enumerate((signal.SIGTERM, signal.SIGTERM, signal.SIGKILL, None))]
    assert summarise(facts).stop_signal == (signal.SIGTERM, 2)
    assert summarise([RankFacts(0, RankState.RUNNING, True)]).stop_signal is None


def test_gpus_are_counted_averaged_over_live_ranks_and_the_fullest_rank_named() -> None:
    summary = summarise([RankFacts(0, RankState.RUNNING, True, gpu=gpu(0, 90.0, 30)),
                         RankFacts(1, RankState.RUNNING, True, gpu=gpu(1, 70.0, 60)),
                         RankFacts(2, RankState.EXITED, False, gpu=gpu(2, 0.0, 10))])
    assert (summary.gpus, summary.gpu_util) == (3, 80.0)
    assert summary.gpu_memory == (1, 60 * GIB, 80 * GIB, True)
    assert summarise([RankFacts(0, RankState.RUNNING, True)]).gpus == 0


def test_a_summary_ages_by_the_time_since_it_was_made() -> None:
    summary = summarise([RankFacts(0, RankState.RUNNING, True, 3, step_age=2.0,
                                   output_age=1.0)])
    assert (summary.aged(5.0).step_wait, summary.aged(5.0).output_age) == (7.0, 6.0)
    assert summary.aged(0.0) is summary
    ended = summarise([RankFacts(0, RankState.EXITED, False, exit_code=0)])
    assert ended.aged(60.0) is ended  # nothing live: nothing waits


def test_a_records_facts_wait_from_its_last_step_not_its_output() -> None:
    record = rank_record(0, pid=100, started_mono=0.0)
    assert record.facts(10.0).step_age is None  # no step yet
    record.saw(Evidence.STEP, 4.0)
    record.saw(Evidence.OUTPUT, 9.0)
    facts = record.facts(10.0)
    assert facts.step_age == 6.0 and facts.live and facts.state is RankState.RUNNING


def test_what_views_show_together() -> None:
    one, two = Watch(True, frozenset({1})), Watch(True, frozenset({2, 3}))
    assert (one | two) == Watch(True, frozenset({1, 2, 3}))
    assert (one | EVERY_RANK).nodes is None
    assert (NOTHING | one) == one and (one | NOTHING) == one
    assert (NOTHING | NOTHING) == NOTHING
    assert one.opened(range(4)) == {1} and EVERY_RANK.opened([0, 2]) == {0, 2}
    assert NOTHING.opened(range(4)) == set() and Watch(False, None).opened(range(4)) == set()
