"""A scripted run for the TUI: the same surface as the real session, driven by hand.

The snapshot tests, the Pilot tests and the screenshot script (screenshots/make.py) all use
these states, so the screenshots in the README are exactly what the tests check. Test code:
it lives in tests/, not in the package.
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import conftest

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import ProgressSource, Purpose, RankState, SignalSent, Stream
from forgelm_tui.engine.records import CancelRequest, CancelSource, RankRecord, StopRecord
from forgelm_tui.engine.signal_inbox import Sender
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.envelope.build import build
from forgelm_tui.envelope.write import write_atomic
from forgelm_tui.plan.planner import RunInfo
from forgelm_tui.session.ending import RunEnding
from forgelm_tui.session.outcome import RunFrame, RunOutcome, node_outcome
from forgelm_tui.signames import signal_name
from forgelm_tui.verdict import Contract, StopFacts, StopKind, decide

T0 = 1_796_040_000.0  # a fixed epoch second, so every rendered time is the same on every run
HANDLES_USR = 1 << (signal.SIGUSR1 - 1) | 1 << (signal.SIGUSR2 - 1)  # SigCgt of the scripted ranks


class FakeClock(conftest.FakeClock):
    """The shared fake clock, from T0: wall-clock seconds under the test's control."""

    def __init__(self, start: float = T0) -> None:
        super().__init__(start)


class ScriptedRun:
    """Stands in for :class:`forgelm_tui.session.run.Session`; records the commands it receives."""

    def __init__(self, world_size: int, *, run_id: str = "20261130-120000-abc123",
                 grace: float = 30.0, command: list[str] | None = None) -> None:
        self.run_id = run_id
        self.world_size = world_size
        self.grace = grace
        self.command = command or ["forgelm-tui", "--nproc-per-node", str(world_size),
                                   "--config", "job.yaml"]
        self.commands: list[tuple[str, Any]] = []
        self.by_signal = False
        self._listeners: list[Callable[[ev.Event], None]] = []
        self._outcome: asyncio.Future[RunEnding] | None = None

    def subscribe(self, listener: Callable[[ev.Event], None]) -> None:
        self._listeners.append(listener)

    def emit(self, *events: ev.Event) -> None:
        for event in events:
            for listener in self._listeners:
                listener(event)

    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT, *,
                       source: CancelSource = CancelSource.OPERATOR,
                       sender: Sender | None = None) -> str:
        self.commands.append(("cancel", origin))
        return "stop"

    def kill_now(self, origin: str = "operator",
                 source: CancelSource = CancelSource.OPERATOR) -> None:
        self.commands.append(("kill", origin))

    def forward(self, sig: int, origin: str | None = "operator",
                source: CancelSource = CancelSource.OPERATOR,
                sender: Sender | None = None) -> None:
        self.commands.append(("forward", signal_name(sig)))

    def request_stacks(self, origin: str = "operator") -> bool:
        self.commands.append(("stacks", origin))
        return False  # no rank runs here to capture (tests/test_stacks_tui.py's StacksRun can)

    def cancelled_by_signal(self) -> bool:
        return self.by_signal

    async def run(self) -> RunEnding:
        self._outcome = asyncio.get_running_loop().create_future()
        return await self._outcome

    def finish(self, outcome: RunEnding) -> None:
        assert self._outcome is not None, "the app has not started the run yet"
        self._outcome.set_result(outcome)


# ---------------------------------------------------------------------- the states


def _state(run: ScriptedRun, rank: int, state: RankState) -> None:
    run.emit(ev.RankStateChanged(rank, state))


def _launched(run: ScriptedRun) -> None:
    """The run and every rank started at T0, every rank running."""
    run.emit(ev.RunStarted(run.run_id, run.world_size, ("python",), "/runs/x", T0))
    for rank in range(run.world_size):
        run.emit(ev.RankStarted(rank, rank, 41000 + rank, T0))
        _state(run, rank, RankState.RUNNING)


def start_ranks(run: ScriptedRun, clock: FakeClock, quiet: int | None = None) -> None:
    _launched(run)
    clock.advance(95 - 7.5)
    for step in range(2, 31, 2):  # 4 steps/s over the last 7.5 s: a loss curve and a pace
        for rank in range(run.world_size):
            if rank != quiet:
                run.emit(ev.RankProgressed(rank, step, 1200, {"loss": _loss(step, rank)},
                                           ProgressSource.CHANNEL))
        clock.advance(0.5)
    for step in range(1, 4):
        for rank in range(run.world_size):
            if rank != quiet:
                line = f"{{'loss': {2.5 - 0.1 * step - 0.01 * rank:.4f}, 'step': {step * 10}}}"
                run.emit(ev.RankOutput.of(rank, Stream.STDOUT, (line,)))
    if quiet is not None:
        run.emit(ev.RankOutput.of(quiet, Stream.STDERR, (
            "waiting at barrier (rank idles while rank 0 evaluates)",)))
    clock.advance(2)
    for rank in range(run.world_size):
        is_quiet = rank == quiet
        run.emit(ev.RankSampled(rank, {"cpu": 0.0 if is_quiet else 97.5 - rank,
                                       "rss": 1_503_238_553 + rank * 1_048_576, "children": 2},
                                42.0 if is_quiet else 2.0, HANDLES_USR))
        if is_quiet:
            _state(run, rank, RankState.QUIET)


def _loss(step: int, rank: int) -> float:
    """A falling, slightly noisy loss that reaches 2.2 - 0.01 * rank at step 30."""
    wobble = ((step * 7 + rank * 3) % 5 - 2) * 0.04 if step < 30 else 0.0
    return round(2.2 - 0.01 * rank + 1.2 * (30 - step) / 28 + wobble, 4)


def _stop(run: ScriptedRun, clock: FakeClock, ranks: tuple[int, ...], kind: StopKind,
          reason: str, origin: str) -> None:
    for rank in ranks:
        run.emit(ev.RankSignalled(rank, signal.SIGTERM, Purpose.STOP, reason, clock()))
        _state(run, rank, RankState.STOPPING)
    run.emit(ev.RunStopping(kind, reason, origin, run.grace, ranks, clock()))


def _exit(run: ScriptedRun, clock: FakeClock, rank: int, code: int | None, sig: int | None,
          state: RankState) -> None:
    run.emit(ev.RankExited(rank, code, sig, sig is not None, clock()))
    _state(run, rank, state)


def state_running(run: ScriptedRun, clock: FakeClock) -> None:
    """8 ranks training, rank 5 quiet."""
    start_ranks(run, clock, quiet=5)


def state_cancelling(run: ScriptedRun, clock: FakeClock) -> None:
    """The operator cancelled; rank 3 ignores SIGTERM and the grace counts down."""
    start_ranks(run, clock)
    live = tuple(range(run.world_size))
    _stop(run, clock, live, StopKind.CANCEL, "cancelled by operator", "operator")
    clock.advance(1)
    for rank in live:
        if rank != 3:
            _exit(run, clock, rank, None, signal.SIGTERM, RankState.KILLED)
    clock.advance(5)
    run.emit(ev.StopCountdown(run.grace - 6, (3,)))


def state_training(run: ScriptedRun, clock: FakeClock) -> None:
    """4 ranks half-way through 1200 steps at 10 steps/s, rank 3 15 steps behind: the bars,
    the pace and the loss curves."""
    _launched(run)
    clock.advance(60)
    for report in range(1, 121):
        for rank in range(run.world_size):
            step = 5 * report - (15 if rank == 3 else 0)
            wobble = ((report * 7 + rank * 3) % 5 - 2) * 0.03
            loss = round(0.8 + 2.4 * math.exp(-step / 300) + wobble, 4)
            run.emit(ev.RankProgressed(rank, step, 1200, {"loss": loss}, ProgressSource.CHANNEL))
            if report % 30 == 0:
                run.emit(ev.RankOutput.of(rank, Stream.STDOUT, (f"step {step}/1200 loss {loss}",)))
        clock.advance(0.5)
    for rank in range(run.world_size):
        run.emit(ev.RankSampled(rank, {"cpu": 99.0 - rank, "rss": 2_147_483_648 + rank * 1_048_576,
                                       "children": 2}, 0.5, HANDLES_USR))


def _records(world: int, ends: dict[int, tuple[int | None, int | None, float, list[SignalSent]]],
             stderr: dict[int, list[str]] | None = None) -> list[RankRecord]:
    records = []
    for rank in range(world):
        code, sig, end, sent = ends[rank]
        record = conftest.rank_record(rank, "/runs/x", pid=41000 + rank, started_at=T0,
                                      started_mono=0.0)
        record.signals_sent.extend(sent)
        record.mark_exit(-sig if sig else int(code or 0))
        record.ended_at, record.ended_mono = T0 + end, end
        record.stderr_tail.extend((stderr or {}).get(rank, []))
        records.append(record)
    return records


def _outcome(run: ScriptedRun, records: list[RankRecord], stop: StopRecord | None,
             cancels: list[CancelRequest], results: dict[int, dict[str, Any]],
             envelope_dir: Path | None) -> RunEnding:
    facts = StopFacts(stop.kind, stop.signal) if stop else None
    verdict = decide([r.ending() for r in records], facts, Contract.FORGELM)
    spec = LaunchSpec(argv=(), run_id=run.run_id, run_dir=Path("/runs/x"),
                      nproc_per_node=run.world_size, master_addr="127.0.0.1", master_port=29500,
                      grace=run.grace, drain=60.0)
    info = RunInfo(run_id=run.run_id, command=run.command, mode="forgelm",
                   contract=Contract.FORGELM, spec=spec, run_dir="/runs/x", grace=run.grace)
    part = node_outcome(0, records, cancels=cancels, results=results)
    envelope = build(info, RunOutcome(verdict, RunFrame(T0, T0 + 130), (part,), stop=stop),
                     run_dir="/runs/x")
    path = "/runs/x/envelope.json"
    if envelope_dir is not None:
        target = envelope_dir / "envelope.json"
        write_atomic(target, envelope)
        path = str(target)
    return RunEnding(verdict, envelope, path)


def _rank_failed(run: ScriptedRun, clock: FakeClock, failed: int, trace: list[str],
                 envelope_dir: Path | None) -> RunEnding:
    """Rank ``failed`` prints ``trace`` and exits 2 on its own; the others are stopped."""
    run.emit(ev.RankOutput.of(failed, Stream.STDERR, tuple(trace)))
    _exit(run, clock, failed, 2, None, RankState.FAILED)
    reason = f"rank {failed} failed (exit 2)"
    sent = [SignalSent(signal.SIGTERM, T0 + 120.001, reason, Purpose.STOP)]
    others = tuple(r for r in range(run.world_size) if r != failed)
    _stop(run, clock, others, StopKind.FAILURE, reason, "failure")
    for rank in others:
        _exit(run, clock, rank, None, signal.SIGTERM, RankState.KILLED)
    run.emit(ev.RunFinished(clock()))
    ends: dict[int, tuple[int | None, int | None, float, list[SignalSent]]] = {
        r: (None, signal.SIGTERM, 121.0, sent) for r in others}
    ends[failed] = (2, None, 120.0, [])
    stop = StopRecord(StopKind.FAILURE, reason, "failure", None, T0 + 120.001, 0.0)
    records = _records(run.world_size, ends, {failed: trace})
    return _outcome(run, records, stop, [], {}, envelope_dir)


def state_failed(run: ScriptedRun, clock: FakeClock, envelope_dir: Path | None = None) -> RunEnding:
    """Rank 1 crashed on its own; the others were stopped; the verdict names rank 1."""
    start_ranks(run, clock)
    trace = ["Traceback (most recent call last):",
             '  File "forgelm/trainer.py", line 812, in train',
             "    loss.backward()",
             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    return _rank_failed(run, clock, 1, trace, envelope_dir)


def state_crashed(run: ScriptedRun, clock: FakeClock,
                  envelope_dir: Path | None = None) -> RunEnding:
    """At step 40 of 100 rank 2 raised ``ValueError: boom`` deep in a long traceback; the
    others were stopped. The exception line is the last of its stderr tail."""
    start_ranks(run, clock)
    for rank in range(run.world_size):
        run.emit(ev.RankProgressed(rank, 40, 100, {"loss": 1.9 - 0.01 * rank},
                                   ProgressSource.CHANNEL))
    trace = ["Traceback (most recent call last):"]
    for depth, name in enumerate(("train", "step", "forward", "collate", "tokenize", "check")):
        trace += [f'  File "forgelm/{name}.py", line {100 + 17 * depth}, in {name}',
                  f"    return {name}_inner(batch)"]
    trace.append("ValueError: boom")
    return _rank_failed(run, clock, 2, trace, envelope_dir)


def state_approval(run: ScriptedRun, clock: FakeClock,
                   envelope_dir: Path | None = None) -> RunEnding:
    """Both ranks staged their model and exit 4: awaiting human approval."""
    start_ranks(run, clock)
    results = {}
    for rank in range(run.world_size):
        run_id = f"fg-5d1cf2f7398{rank}"
        result = {"success": True, "awaiting_approval": True, "run_id": run_id,
                  "staging_path": f"/jobs/tiny/out/final_model.staging.{run_id}"}
        results[rank] = result
        run.emit(ev.RankOutput.of(rank, Stream.STDOUT, ('{', '  "success": true,',
                                                      '  "awaiting_approval": true', '}')))
        _exit(run, clock, rank, 4, None, RankState.EXITED)
    run.emit(ev.RunFinished(clock()))
    ends: dict[int, tuple[int | None, int | None, float, list[SignalSent]]] = {
        r: (4, None, 125.0, []) for r in range(run.world_size)}
    records = _records(run.world_size, ends)
    return _outcome(run, records, None, [], results, envelope_dir)


def state_hung(run: ScriptedRun, clock: FakeClock, envelope_dir: Path | None = None) -> RunEnding:
    """Rank 2 never entered all_reduce #1043; the others wait in it: a stall, named."""
    start_ranks(run, clock)
    run.emit(ev.RunStalled(600.0, (0, 1, 2, 3)))
    reason = "stalled: no rank made progress for 600 s"
    ranks = tuple(range(run.world_size))
    _stop(run, clock, ranks, StopKind.STALL, reason, "stall")
    for rank in ranks:
        _exit(run, clock, rank, None, signal.SIGTERM, RankState.KILLED)
    run.emit(ev.RunFinished(clock()))
    sent = [SignalSent(signal.SIGTERM, T0 + 120.001, reason, Purpose.STOP)]
    records = _records(run.world_size, {r: (None, signal.SIGTERM, 121.0, sent) for r in ranks})
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252"
    for record in records:
        missing = record.rank == 2
        record.stalled, record.collectives = True, {"0": 1042 if missing else 1043}
        record.stacks = ev.RankStacks(
            record.rank, "/jobs/train.py:88 load_batch" if missing else f"{c10d} all_reduce",
            f"/runs/x/rank-{record.rank}.stacks.txt", "faulthandler")
    stop = StopRecord(StopKind.STALL, reason, "stall", None, T0 + 120.001, 0.0)
    return _outcome(run, records, stop, [], {}, envelope_dir)


NODES, PER_NODE = 16, 8


def _remote(rank: int, step: int, state: RankState, clock: FakeClock,
            sent: tuple[SignalSent, ...] = (), code: int | None = None) -> ev.RankSnapshot:
    """Another node's rank as its node's view says (cluster/views.py)."""
    ended = clock() if code is not None else None
    return ev.RankSnapshot(
        rank, rank % PER_NODE, rank // PER_NODE, 52000 + rank, state, T0, ended, code, None,
        sent, f"step {step}/1200", clock() - 1, step, 1200, {"loss": round(1.9 - step / 2000, 4)},
        ProgressSource.CHANNEL, {"cpu": 98.0, "rss": 2_147_483_648.0, "children": 2.0})


def state_nodes(run: ScriptedRun, clock: FakeClock) -> None:
    """16 nodes x 8 ranks, seen from node 0: rank 77 (node 9) failed on its own at step 610,
    and the stop reached every other rank; node 13 is a step behind the rest."""
    run.emit(ev.RunStarted(run.run_id, run.world_size, ("python",), "/runs/x", T0,
                           node_rank=0, nnodes=NODES))
    for rank in range(PER_NODE):
        run.emit(ev.RankStarted(rank, rank, 41000 + rank, T0))
        _state(run, rank, RankState.RUNNING)
    clock.advance(300)
    for step in (600, 605, 610):
        for rank in range(PER_NODE):
            run.emit(ev.RankProgressed(rank, step, 1200, {"loss": round(1.9 - step / 2000, 4)},
                                       ProgressSource.CHANNEL))
            run.emit(ev.RankOutput.of(rank, Stream.STDOUT, (f"step {step}/1200",)))
        for node in range(1, NODES):
            ranks = range(node * PER_NODE, (node + 1) * PER_NODE)
            run.emit(ev.NodeChanged(node, f"gpu{node:03d}", ev.NodeState.RUNNING, tuple(
                _remote(r, step - (5 if node == 13 else 0), RankState.RUNNING, clock)
                for r in ranks), clock()))
        clock.advance(5)
    reason = "rank 77 failed (exit 2)"
    sent = (SignalSent(signal.SIGTERM, clock(), reason, Purpose.STOP),)
    for node in range(1, NODES):
        ranks = range(node * PER_NODE, (node + 1) * PER_NODE)
        run.emit(ev.NodeChanged(node, f"gpu{node:03d}", ev.NodeState.RUNNING, tuple(
            _remote(r, 605 if node == 13 else 610, RankState.FAILED, clock, code=2) if r == 77
            else _remote(r, 605 if node == 13 else 610, RankState.STOPPING, clock, sent)
            for r in ranks), clock()))
    _stop(run, clock, tuple(range(PER_NODE)), StopKind.FAILURE, reason, "failure")
    clock.advance(3)


STATES: dict[str, tuple[int, Callable[..., Any]]] = {
    "running": (8, state_running),
    "cancelling": (8, state_cancelling),
    "failed": (4, state_failed),
    "approval": (2, state_approval),
    "crashed": (4, state_crashed),
    "training": (4, state_training),
    "hung": (4, state_hung),
    "nodes": (NODES * PER_NODE, state_nodes),
}
ENDED = ("failed", "approval", "crashed", "hung")  # states that finish the run


async def pilot_wait_for(pilot: Any, condition: Callable[[], Any], what: str,
                         timeout: float = 10.0) -> None:
    """Let the app run until ``condition`` holds (conftest.wait_for, for a Pilot)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.02)


def scripted_app(name: str, *, envelope_dir: Path | None = None,
                 save_directory: Path | None = None) -> tuple[Any, ScriptedRun, Any]:
    """An app on a scripted run, and an async ``prepare(pilot)`` that plays state ``name``.

    The snapshot tests, the Pilot tests and screenshots/make.py all start from here.
    """
    from forgelm_tui.tui.app import build_app

    world, play = STATES[name]
    run = ScriptedRun(world)
    clock = FakeClock()
    app = build_app(run, clock=clock, save_directory=save_directory)

    async def prepare(pilot: Any) -> None:
        await pilot.pause()
        if name in ENDED:
            run.finish(play(run, clock, envelope_dir))
        else:
            play(run, clock)
        await pilot.pause()
        app.refresh_table()
        app.flush_logs()
        await pilot.pause()
        if app.query_one("#curves").refresh_from_model(force=True):
            await pilot.pause()  # new curves are drawn once mounted
            await pilot.pause()
        await _settled_log(pilot, app)

    return app, run, prepare


async def _settled_log(pilot: Any, app: Any) -> None:
    """Wait until a following log pane shows its newest line on two pauses in a row: the
    curves' mount shrinks the pane, which must then scroll itself back to its end (Textual may
    send it no Resize: LogPane._size_updated). Without that the pane stays a line short and
    this wait fails."""
    from forgelm_tui.tui.widgets.log_pane import LogPane

    pane = app.query_one(LogPane)

    def at_end() -> bool:
        return not pane.auto_scroll or round(pane.scroll_y) >= pane.max_scroll_y

    for _ in range(2):
        await pilot_wait_for(pilot, at_end, "the following log pane at its newest line")
        await pilot.pause()
