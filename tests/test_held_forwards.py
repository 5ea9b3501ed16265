"""A signal to forward that comes before the ranks can take it is held (issue 20, point 4).

The rule in-process (engine/held_forwards.py, on records and an injected clock); the wiring, a
real SIGUSR1 to a node still joining reaching its rank once the rank handles it:
test_multinode.py::test_a_signal_while_the_nodes_join_is_held_until_the_rank_handles_it.
"""

from __future__ import annotations

import signal

from conftest import FakeClock, rank_record

from forgelm_tui.engine.held_forwards import HeldForwards
from forgelm_tui.engine.records import CancelSource, ForwardRequest, RankRecord

USR1 = 1 << (signal.SIGUSR1 - 1)


def _request(at: float, sig: int = signal.SIGUSR1) -> ForwardRequest:
    return ForwardRequest(CancelSource.SIGNAL, "SIGUSR1 to the supervisor", sig, at, ())


def _ranks(*masks: tuple[int, int]) -> list[RankRecord]:
    return [rank_record(rank, pid=1000 + rank, caught_mask=caught, ignored_mask=ignored)
            for rank, (caught, ignored) in enumerate(masks)]


def test_held_until_each_rank_handles_it_then_recorded_once() -> None:
    clock, sent = FakeClock(100.0), []
    held = HeldForwards(clock)
    held.hold(_request(100.0))
    ranks = _ranks((0, 0), (0, 0))

    def send(records: list[RankRecord], sig: int, *_: object) -> list[RankRecord]:
        sent.extend((record.rank, sig) for record in records)
        return records

    assert held.deliver(ranks, send) == [] and sent == []  # not released: no rank started yet
    clock.advance(5)
    held.release([0, 1])
    assert held.deliver(ranks, send) == [] and sent == []  # no handler yet: it would kill them
    ranks[1].caught_mask = USR1
    assert held.deliver(ranks, send) == [] and sent == [(1, signal.SIGUSR1)]
    ranks[0].ignored_mask = USR1  # ignoring it is taking it too: harmless to send
    clock.advance(1)
    (done,) = held.deliver(ranks, send)
    assert sent == [(1, signal.SIGUSR1), (0, signal.SIGUSR1)]
    assert (done.ranks, done.held_since, done.at) == ((0, 1), 100.0, 106.0)
    assert not held and held.deliver(ranks, send) == [] and held.close() == []


def test_a_rank_that_ends_or_never_handles_it_is_left_out() -> None:
    clock = FakeClock(50.0)
    held = HeldForwards(clock)
    held.hold(_request(50.0))
    held.release([0, 1])
    ranks = _ranks((USR1, 0), (0, 0))
    assert held.deliver(ranks, lambda records, *_: records) == []  # rank 1 may still install one
    ranks[1].ended_mono = 1.0  # ended without one
    (done,) = held.deliver(ranks, lambda records, *_: records)
    assert done.ranks == (0,)


def test_a_run_that_ends_first_records_what_it_held() -> None:
    held = HeldForwards(FakeClock(10.0))
    held.hold(_request(7.0))
    (left,) = held.close()  # a stop or a refused join before any rank started
    assert (left.ranks, left.held_since, left.at) == ((), 7.0, 10.0)


def test_a_failed_send_is_tried_again() -> None:
    held = HeldForwards(FakeClock(0.0))
    held.hold(_request(0.0))
    held.release([0])
    ranks = _ranks((USR1, 0))
    assert held.deliver(ranks, lambda records, *_: []) == []
    (done,) = held.deliver(ranks, lambda records, *_: records)
    assert done.ranks == (0,)
