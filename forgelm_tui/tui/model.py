"""What the TUI shows, folded from engine events. No Textual here: it is plain, testable state.

The engine calls :meth:`RunModel.apply` for every event on the event loop; widgets read the model
on their own timers (table, curves: 1 Hz; logs: 10 Hz): a flood of events is no flood of repaints.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from forgelm_tui.engine import ages
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import Purpose, RankState
from forgelm_tui.signames import handles, signal_name
from forgelm_tui.tui.gpu_view import GpuView
from forgelm_tui.tui.logs import CHUNK_BYTES as CHUNK_BYTES  # re-exported
from forgelm_tui.tui.logs import LOG_KEEP_MERGED as LOG_KEEP_MERGED
from forgelm_tui.tui.logs import LOG_KEEP_MERGED_BYTES as LOG_KEEP_MERGED_BYTES
from forgelm_tui.tui.logs import LOG_KEEP_RANKS_BYTES as LOG_KEEP_RANKS_BYTES
from forgelm_tui.tui.logs import ChunkQueue as ChunkQueue
from forgelm_tui.tui.logs import LogLine as LogLine
from forgelm_tui.tui.logs import LogStore
from forgelm_tui.tui.progress_view import RankHistory
from forgelm_tui.verdict import describe


@dataclass
class RankRow:
    rank: int
    local_rank: int = 0
    pid: int | None = None
    state: RankState = RankState.STARTING
    gauges: ev.Gauges = field(default_factory=dict)  # by column key (engine/sampler.py)
    caught_mask: int = 0  # signals its main process handles or ignores (from samples)
    ignored_mask: int = 0
    sampled: bool = False  # the masks are known
    started_at: float | None = None
    ended_at: float | None = None
    last_output_at: float | None = None
    last_line: str = ""
    exit_code: int | None = None
    signal: int | None = None
    sent: list[tuple[int, Purpose, str]] = field(default_factory=list)  # signal, why, reason
    step: int | None = None
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    evidence: ev.ProgressEvidence | None = None  # what kind of progress counts for it
    node_rank: int | None = None  # another node's rank (multi-node); None: this node's
    history: RankHistory = field(default_factory=RankHistory)  # curve, step rate (progress_view)

    @property
    def ended(self) -> bool:
        return self.state in (RankState.EXITED, RankState.KILLED, RankState.FAILED)

    def would_die_of(self, sig: int) -> bool | None:
        """Would forwarding ``sig`` end this live rank? None while its masks are unknown."""
        if not self.sampled:
            return None
        return not handles(self.caught_mask, self.ignored_mask, sig)

    def progress_text(self) -> str:
        """``12/30 loss 0.3100``: step, total and the first metric."""
        if self.step is None and not self.metrics:
            return ""
        parts = []
        if self.step is not None:
            parts.append(f"{self.step}/{self.total}" if self.total else str(self.step))
        for name, value in list(self.metrics.items())[:1]:
            parts.append(f"{name} {value:.4g}")
        return " ".join(parts)

    def exit_text(self) -> str:
        return "" if self.exit_code is None else exit_words(self.exit_code)

    def signal_text(self) -> str:
        """``SIGTERM, sent: operator cancel``: the last signal and who sent it."""
        stops = [(sig, reason) for sig, purpose, reason in self.sent if purpose.stops]
        forwarded = [sig for sig, purpose, _ in self.sent if purpose is Purpose.FORWARD]
        if self.signal is not None:
            name = signal_name(self.signal)
            if stops:
                return f"{name}, sent: {_short_reason(stops[-1][1])}"
            if self.signal in forwarded:
                return f"{name}, forwarded by forgelm-tui"
            return f"{name}, not sent by forgelm-tui"
        if stops:
            sig, reason = stops[-1]
            return f"{signal_name(sig)}, sent: {_short_reason(reason)}"
        return ""


def exit_words(code: int) -> str:
    """``4 AWAITING_APPROVAL``: an exit code and its short name."""
    return f"{code} {describe(code)[0].removeprefix('EXIT_')}"


def _short_reason(reason: str) -> str:
    """``cancelled by operator`` -> ``operator cancel``, kept short for a table cell."""
    if reason.startswith("cancelled by "):
        return reason.removeprefix("cancelled by ") + " cancel"
    return reason


class RunModel:
    """The run as the TUI shows it, folded from events (or a snapshot, then events).

    Times are wall-clock seconds, from the events where they carry one, else from ``clock``:
    a viewer in another process computes the same ages and countdowns.
    """
    attempt: ev.AttemptStarted | None = None  # with --max-restarts: tui/attempt.py keeps it

    def __init__(self, run_id: str, command: Sequence[str], world_size: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.run_id = run_id
        self.command = list(command)
        self.world_size = world_size
        self.clock = clock
        self.started_at = clock()
        self.ended_at: float | None = None
        self.state = "starting"
        self.stop: ev.RunStopping | None = None
        self.stop_deadline: float | None = None
        self.live_ranks: tuple[int, ...] = ()
        # Before a rank starts its local rank is already known (one node): no misleading 0s.
        self.ranks: dict[int, RankRow] = {r: RankRow(r, local_rank=r) for r in range(world_size)}
        self.verdict: ev.VerdictReached | None = None
        self.logs = LogStore()
        self.notices: deque[str] = deque(maxlen=50)
        self.node_rank, self.nnodes, self.gpu = 0, 1, GpuView()  # gpu: tui/gpu_view.py
        self.nodes: dict[int, ev.NodeState] = {}  # other nodes of a multi-node run
        # ...each one's ranks summed up, as it last said, and when this view got it (its row)
        self.summaries: dict[int, tuple[ev.NodeSummary, float]] = {}
        self.stalled: set[int] = set()  # ranks the stall rule named (shown when grouped)
        self.hang_missing: set[int] = set()  # the ended run's hang: who never entered it
        self.changed = True

    @property
    def stop_reason(self) -> str:
        return self.stop.reason if self.stop else ""

    def row(self, rank: int) -> RankRow:
        return self.ranks.get(rank) or self.ranks.setdefault(rank, RankRow(rank))  # made once

    def apply(self, event: ev.Event) -> None:
        self.changed = True
        self.gpu.apply(event)
        match event:
            case ev.RankOutput(rank=rank) as output:
                row = self.row(rank)
                row.last_output_at = self.clock()
                row.last_line = output.last_line
                self.logs.add(output)
            case ev.RankSampled():
                self._sampled(event)
            case ev.RankStateChanged(rank=rank, state=state):
                self.row(rank).state = state
            case ev.RankStarted(rank=rank, local_rank=local_rank, pid=pid, at=at):
                row = self.row(rank)
                row.local_rank, row.pid, row.started_at = local_rank, pid, at
            case ev.RankSignalled(rank=rank, signal=sig, purpose=purpose, reason=reason):
                self.row(rank).sent.append((sig, purpose, reason))
            case ev.RankExited(rank=rank, exit_code=code, signal=sig, at=at):
                row = self.row(rank)
                row.exit_code, row.signal, row.ended_at = code, sig, at
                self.live_ranks = tuple(r for r in self.live_ranks if r != rank)
            case ev.RankProgressed(rank=rank, step=step, total=total, metrics=metrics):
                row = self.row(rank)
                row.step, row.total, row.metrics = step, total, dict(metrics)
                row.history.add(step, metrics, self.clock())
            case ev.RankEvidenceChanged(rank=rank, evidence=evidence):
                self.row(rank).evidence = evidence
            case _:
                self._run_event(event)

    def _run_event(self, event: ev.Event) -> None:
        match event:
            case ev.RunStarted(at=at):  # a stop may come first (cancelled before the launch)
                self.state, self.started_at = "stopping" if self.stop else "running", at
                self.node_rank, self.nnodes = event.node_rank, event.nnodes
                self._local_rows(event.world_size // max(1, event.nnodes))
            case ev.NodeChanged() as node:
                self._node(node)
            case ev.RunStopping(live_ranks=live) as stopping:
                self.state, self.stop, self.live_ranks = "stopping", stopping, live
                self.stop_deadline = stopping.deadline_at
            case ev.GraceExtended(grace=grace, why=why) if self.stop is not None:
                self.stop = replace(self.stop, grace=grace)
                self.stop_deadline = self.stop.deadline_at
                self.notices.append(f"grace now {grace:g} s: {why}")
            case ev.StopCountdown(seconds_left=left, live_ranks=live):
                self.stop_deadline, self.live_ranks = self.clock() + left, live
            case ev.RunStalled(seconds=seconds, ranks=ranks):
                self.stalled.update(ranks)
                self.notices.append(f"stalled: no progress from rank(s) {ranks} for {seconds:g} s")
            case ev.SignalForwarded(signal=sig, ranks=ranks):
                self.notices.append(f"{signal_name(sig)} forwarded to {len(ranks)} rank(s)")
            case ev.RankReportedStop(rank=rank, signal=sig, foreign=True) if sig:
                self.notices.append(f"rank {rank} received {sig} from outside forgelm-tui")
            case ev.RunFinished(at=at):
                self.state, self.ended_at = "finished", at
            case ev.RunNotice(text=text):
                self.notices.append(text)
            case ev.VerdictReached() as verdict:
                self.state, self.verdict = "finished", verdict

    def finished(self, envelope: dict[str, object]) -> None:
        """The run's ending, from its envelope: a stall's hang names the ranks that never
        entered the collective the others wait in (shown under their node when grouped)."""
        self.state = "finished"
        hang = envelope.get("hang")
        missing = hang.get("missing_ranks") if isinstance(hang, dict) else None
        self.hang_missing = {r for r in missing or () if isinstance(r, int)}
        self.changed = True

    def restore(self, snapshot: ev.RunSnapshot) -> None:
        """Start from a snapshot: what a viewer that saw every event up to it would show."""
        self.world_size, self.started_at = snapshot.world_size, snapshot.started_at or 0.0
        self.node_rank, self.nnodes = snapshot.node_rank, snapshot.nnodes
        self.ranks = {r.rank: _row(r) for r in snapshot.ranks}
        self.gpu.restore(snapshot)
        self.state = "running" if snapshot.started_at is not None else "starting"
        if snapshot.stop is not None:
            self._run_event(snapshot.stop)
            self.live_ranks = tuple(r.rank for r in snapshot.ranks if r.pid is not None
                                    and r.ended_at is None)
        if snapshot.finished_at is not None:
            self._run_event(ev.RunFinished(snapshot.finished_at))
        if snapshot.verdict is not None:
            self._run_event(snapshot.verdict)
        self.changed = True

    def _local_rows(self, per_node: int) -> None:
        """Rows numbered as this node's ranks once the node rank is known (multi-node)."""
        first = self.node_rank * per_node
        for rank in list(self.ranks):
            row = self.ranks[rank]
            if row.pid is None and row.node_rank is None and not first <= rank < first + per_node:
                row.node_rank = rank // per_node
            if first <= rank < first + per_node:
                row.local_rank = rank - first

    def _node(self, node: ev.NodeChanged) -> None:
        """Another node's ranks, as it last reported them; a lost node is a notice."""
        if self.nodes.get(node.node_rank) is not node.state and node.state is ev.NodeState.LOST:
            self.notices.append(f"node {node.node_rank} lost: its supervisor went silent")
        self.nodes[node.node_rank] = node.state
        if node.summary is not None:
            self.summaries[node.node_rank] = (node.summary, self.clock())
        if not node.complete:  # its row only: its other ranks' details stop here (not frozen)
            told = {s.rank for s in node.ranks}
            for rank, row in list(self.ranks.items()):
                if row.node_rank == node.node_rank and rank not in told and row.pid is not None:
                    self.ranks[rank] = RankRow(rank, row.local_rank, node_rank=row.node_rank)
        for snap in node.ranks:
            row, old = _row(snap), self.ranks.get(snap.rank)
            row.node_rank = node.node_rank
            if old is not None:  # its steps as this view saw them come: its step rate and wait
                row.history.carry(old.history, curve=not snap.metrics_history)
            # a view without its curve (cluster/views.py): the curve grows from its metrics
            if snap.metrics_history:  # the curve came whole: its last point is these metrics
                row.history.seen(snap.metrics)
            row.history.add(snap.step, snap.metrics, self.clock())
            self.ranks[snap.rank] = row

    def node_text(self, row: RankRow) -> str:
        if row.node_rank is None:
            return str(self.node_rank)
        lost = self.nodes.get(row.node_rank) is ev.NodeState.LOST
        return f"{row.node_rank} lost" if lost else str(row.node_rank)

    def _sampled(self, sample: ev.RankSampled) -> None:
        row = self.row(sample.rank)
        row.gauges = dict(sample.gauges)
        row.caught_mask, row.ignored_mask, row.sampled = (
            sample.caught_mask, sample.ignored_mask, True)

    def elapsed(self) -> float:
        end = self.ended_at if self.ended_at is not None else self.clock()
        return max(0.0, end - self.started_at)

    def seconds_left(self) -> float | None:
        if self.stop_deadline is None or self.state != "stopping":
            return None
        return max(0.0, self.stop_deadline - self.clock())

    def uptime(self, row: RankRow) -> float | None:
        if row.started_at is None:
            return None
        end = row.ended_at if row.ended_at is not None else self.clock()
        return max(0.0, end - row.started_at)

    def output_age(self, row: RankRow) -> float | None:
        return ages.output_age(self.clock(), row.last_output_at, row.started_at, row.ended_at)


def _row(snap: ev.RankSnapshot) -> RankRow:
    return RankRow(
        rank=snap.rank, local_rank=snap.local_rank, pid=snap.pid, state=snap.state,
        gauges=dict(snap.gauges),
        caught_mask=snap.caught_mask, ignored_mask=snap.ignored_mask,
        sampled=snap.pid is not None and snap.ended_at is None,
        started_at=snap.started_at, ended_at=snap.ended_at, last_output_at=snap.last_output_at,
        last_line=snap.last_line, exit_code=snap.exit_code, signal=snap.signal,
        sent=[(s.signal, s.purpose, s.reason) for s in snap.signals], step=snap.step,
        total=snap.total, metrics=dict(snap.metrics), evidence=snap.progress_evidence,
        history=RankHistory(snap.metrics_history))
