"""A node's ranks in a fixed size: what a node's row in a grouped view shows (issue 23).

A view of many nodes (tui/node_groups.py) shows one row per node; the rank details of a node
travel only to a view that opened it (cluster/views.py). So each node sums its own ranks up
(:func:`summarise` over :class:`RankFacts`), whatever their number: ~250 bytes on the wire for
8 ranks or 64. A view computes its own node's row with the same function from its rows, so a
node's row reads the same whichever node shows it.

Ages are durations when the summary was made; a view grows them by the time since it got the
summary (:meth:`NodeSummary.aged`): two machines' clocks are never compared.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from forgelm_tui.engine.gpu_events import RankGpu
from forgelm_tui.engine.states import RankState


@dataclass(frozen=True)
class RankFacts:
    """One rank as its node's row counts it."""

    rank: int
    state: RankState
    live: bool
    step: int | None = None
    total: int | None = None
    step_age: float | None = None  # since its step last moved (a live rank's)
    output_age: float | None = None  # since its last output (a live rank's)
    exit_code: int | None = None
    stop_signal: int | None = None  # the last stop signal forgelm-tui sent it
    gpu: RankGpu | None = None


@dataclass(frozen=True)
class NodeSummary:
    """A node's ranks summed up: their states counted, the slowest rank's step, the longest
    wait for a step and the worst output age of its live ranks, the first failing rank's exit
    code (0 once all ended 0), the stop signal most of them were sent last, their GPUs."""

    ranks: int
    states: tuple[tuple[RankState, int], ...]
    slowest: tuple[int, int, int | None] | None = None  # (rank, step, total)
    step_wait: float | None = None
    output_age: float | None = None
    exit_code: int | None = None
    stop_signal: tuple[int, int] | None = None  # (signal, how many ranks)
    gpus: int = 0  # devices its ranks hold
    gpu_util: float | None = None  # the mean GPU % of its live ranks' devices
    gpu_memory: tuple[int, int, int, bool] | None = None  # fullest rank: rank, used, total, live

    def count(self, state: RankState) -> int:
        return dict(self.states).get(state, 0)

    def aged(self, seconds: float) -> NodeSummary:
        """As it stands ``seconds`` after it was made: its live ranks' waits grown."""
        if seconds <= 0 or (self.step_wait is None and self.output_age is None):
            return self
        return dataclasses.replace(
            self, step_wait=None if self.step_wait is None else self.step_wait + seconds,
            output_age=None if self.output_age is None else self.output_age + seconds)


def summarise(facts: Iterable[RankFacts]) -> NodeSummary:
    ranks = sorted(facts, key=lambda f: f.rank)
    counts = Counter(f.state for f in ranks)
    live = [f for f in ranks if f.live]
    stepped = [f for f in ranks if f.step is not None]
    slowest = min(stepped, key=lambda f: (f.step, f.rank)) if stepped else None
    waits = [f.step_age for f in live if f.step_age is not None]
    outputs = [f.output_age for f in live if f.output_age is not None]
    return NodeSummary(
        ranks=len(ranks), states=tuple(sorted(counts.items(), key=lambda kv: kv[0].value)),
        slowest=None if slowest is None or slowest.step is None
        else (slowest.rank, slowest.step, slowest.total),
        step_wait=round(max(waits), 1) if waits else None,
        output_age=round(max(outputs), 1) if outputs else None,
        exit_code=_exit_code(ranks), stop_signal=_stop_signal(ranks), gpus=_devices(ranks),
        gpu_util=_util(ranks), gpu_memory=_fullest(ranks))


def _exit_code(ranks: list[RankFacts]) -> int | None:
    """The first failing rank's code; 0 once every rank exited 0; None while any runs."""
    ended = [f for f in ranks if f.exit_code is not None]
    failed = [f.exit_code for f in ended if f.exit_code != 0]
    if failed:
        return failed[0]
    return 0 if ended and len(ended) == len(ranks) else None


def _stop_signal(ranks: list[RankFacts]) -> tuple[int, int] | None:
    sent = Counter(f.stop_signal for f in ranks if f.stop_signal is not None)
    if not sent:
        return None
    sig, count = sent.most_common(1)[0]
    return sig, count


def _devices(ranks: list[RankFacts]) -> int:
    return len({d.index for f in ranks if f.gpu for d in f.gpu.devices})


def _util(ranks: list[RankFacts]) -> float | None:
    utils = [d.utilization for f in ranks if f.live and f.gpu for d in f.gpu.devices
             if d.utilization is not None]
    return round(sum(utils) / len(utils), 1) if utils else None


def _fullest(ranks: list[RankFacts]) -> tuple[int, int, int, bool] | None:
    """The rank that holds the most GPU memory: (rank, used, total, live)."""
    memory = [(f.rank, used, total, f.live) for f in ranks if f.gpu
              for used, total in [memory_of(f.gpu)] if used is not None and total]
    return max(memory, key=lambda m: (m[1], -m[0]), default=None)


def memory_of(gpu: RankGpu) -> tuple[int | None, int | None]:
    """A rank's GPU memory (its processes' own where NVML gives it, else its devices' used) of
    its devices' total."""
    totals = [d.memory_total for d in gpu.devices if d.memory_total]
    total = sum(totals) if totals else None
    if gpu.memory_bytes is not None:
        return gpu.memory_bytes, total
    used = [d.memory_used for d in gpu.devices if d.memory_used is not None]
    return (sum(used) if used else None), total


@dataclass(frozen=True)
class Watch:
    """What the views on one node show of the other nodes (cluster/views.py): nothing (no
    view: a headless node), or every node's row and the ranks of ``nodes`` (None: of every
    node, a view that lists every rank)."""

    viewing: bool = False
    nodes: frozenset[int] | None = frozenset()

    def opened(self, others: Iterable[int]) -> set[int]:
        """The other nodes whose ranks it shows."""
        if not self.viewing:
            return set()
        return set(others) if self.nodes is None else set(others) & self.nodes

    def __or__(self, other: Watch) -> Watch:
        viewing = self.viewing or other.viewing
        if not viewing:
            return NOTHING
        mine, theirs = (self.nodes if self.viewing else frozenset(),
                        other.nodes if other.viewing else frozenset())
        return Watch(True, None if mine is None or theirs is None else mine | theirs)


NOTHING = Watch()
EVERY_RANK = Watch(True, None)
