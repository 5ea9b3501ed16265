"""Events as data: every type through JSON and back; a late viewer from a snapshot sees what a
viewer that saw every event sees; signal names for every number."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import make_plan, rank_script, run_cli

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.codec import DecodeError, from_wire, to_wire
from forgelm_tui.engine.events import (
    ProgressEvidence,
    ProgressSource,
    Purpose,
    RankState,
    SignalSent,
    Stream,
)
from forgelm_tui.session.run import Session
from forgelm_tui.signames import signal_name, signal_number
from forgelm_tui.tui.model import RunModel
from forgelm_tui.verdict import StopKind, Verdict

pytestmark = pytest.mark.timeout(60)

VERDICT = Verdict(2, "EXIT_TRAINING_ERROR", "runtime error", "investigate logs", 2,
                  "root cause: rank 1 failed on its own (exit 7)", 1, ((2, 0), (3, 4)))
RANK = ev.RankSnapshot(1, 1, 0, 4242, RankState.STOPPING, 1.5, None, None, None,
                       (SignalSent(15, 2.0, "cancelled by operator", Purpose.STOP),),
                       "step 3 \u00e9", 2.5, 3, 10, {"loss": 0.25}, ProgressSource.CHANNEL,
                       {"cpu": 12.5, "rss": 2.0**30, "children": 2.0},
                       progress_evidence=ProgressEvidence.STEPS,
                       gpu=ev.RankGpu(1, (ev.GpuDevice(0, "GPU-a", "H100", 87.0, 30 << 30,
                                                       80 << 30, 61, 250.5),), 5 << 30))
GPU = ev.GpuDevice(0, "GPU-a", "H100", 87.0, 30 << 30, 80 << 30, 61, 250.5)
STOPPING = ev.RunStopping(StopKind.CANCEL, "cancelled by operator", "operator", 30.0, (0, 1),
                          1.0)
EXAMPLES: list[Any] = [
    ev.RunStarted("r1", 2, ("python", "-u", "t.py"), "/runs/r1", 1.0),
    ev.RankStarted(0, 0, 4242, 1.25),
    ev.RankStateChanged(0, RankState.QUIET),
    ev.RankOutput(1, Stream.STDERR, b"line one\n\xff\xfe not utf-8 \x1b[31m\r\nlast"),
    ev.RankSampled(0, {"cpu": 97.5, "rss": 2.0**31, "children": 3.0}, 4.5, 0x202, 1 << 63),
    ev.GpuSampled((GPU, ev.GpuDevice(1, "GPU-b", "H100", None, None, None, lost=True)),
                  (ev.RankGpu(0, (GPU,), 5 << 30), ev.RankGpu(1, (), None)), 2.5),
    ev.RankSignalled(0, 40, Purpose.FORWARD, "SIGRTMIN+6 forwarded", 2.0),
    ev.RankExited(1, None, 9, True, 3.0),
    STOPPING,
    ev.StopCountdown(12.5, (1,)),
    ev.RunStalled(5.0, (0, 1)),
    ev.StacksCaptured("stall", (ev.RankStacks(0, "/x/t.py:3 spin", "/runs/r1/rank-0.stacks.txt",
                                              "faulthandler"),
                                ev.RankStacks(1, None, None, None, "no handler")), 3.5, 0.25),
    ev.SignalForwarded(10, (0, 1), 4.0),
    ev.RankProgressed(0, 3, None, {"loss": float("inf"), "lr": 1e-4}, ProgressSource.OUTPUT),
    ev.RankEvidenceChanged(1, ProgressEvidence.OUTPUT),
    ev.RankReportedStop(1, "SIGTERM", True, None),
    ev.LogNotKept(1, Stream.STDOUT, "/runs/r1/rank-1.stdout.log", "ENOSPC: No space left", 4.5),
    ev.RunFinished(5.0),
    ev.VerdictReached(VERDICT, "/runs/r1/envelope.json"),
    ev.RunEscalated("second cancel by operator: kill now", 4.5),
    ev.GraceExtended(10.0, "preempted: GraceTime 5 s + SLURM KillWait 10 s, less 5 s", 4.25),
    ev.NodeChanged(1, "gpu-node-7", ev.NodeState.RUNNING, (RANK,), 4.75),
    ev.NodeChanged(2, "gpu-node-8", ev.NodeState.RUNNING, (), 4.8, ev.NodeSummary(
        8, ((ev.RankState.RUNNING, 7), (ev.RankState.QUIET, 1)), (3, 40, 100), 12.5, 0.4, None,
        (15, 8), 8, 97.5, (3, 70 << 30, 80 << 30, True)), complete=False),
    ev.RunNotice("node 0's address job-master-0 does not resolve yet", 4.9),
    ev.RunSnapshot("r1", 2, ("python",), "/runs/r1", 1.0, (RANK,), STOPPING, None,
                   ev.VerdictReached(VERDICT, None)),
    ev.AttemptStarted(1, 2, "rank 1 failed (killed by SIGSEGV)", 1.0, 5.5),
    ev.RunSnapshot("r1", 2, ("python",), "/runs/r1", 6.5, (RANK,),
                   attempt=ev.AttemptStarted(1, 2, "rank 1 failed (exit 2)", 1.0, 5.5)),
]


def test_every_event_type_has_an_example() -> None:
    assert {type(e) for e in EXAMPLES} == {*ev.EVENT_TYPES, ev.RunSnapshot}


@pytest.mark.parametrize("event", EXAMPLES, ids=[type(e).__name__ for e in EXAMPLES])
def test_every_event_round_trips_through_json(event: Any) -> None:
    text = json.dumps(to_wire(event))
    back = from_wire(json.loads(text))
    assert back == event
    assert type(back) is type(event)
    assert json.dumps(to_wire(back)) == text


def test_what_is_not_an_event_is_refused() -> None:
    for bad in ({}, {"type": "Nope"}, {"type": "RankExited", "rank": 1}, [], "x",
                {"type": "RankStateChanged", "rank": 0, "state": "flying"}):
        with pytest.raises(DecodeError):
            from_wire(bad)  # type: ignore[arg-type]


def test_every_signal_number_has_a_name_and_back() -> None:
    names = [signal_name(n) for n in range(1, 65)]
    assert names[39] == "SIGRTMIN+6" and names[61] == "SIGRTMAX-2"
    assert (names[31], names[32], names[33], names[63]) == ("SIG32", "SIG33", "SIGRTMIN",
                                                             "SIGRTMAX")
    assert names[14] == "SIGTERM" and names[9] == "SIGUSR1"
    assert [signal_number(n) for n in names] == list(range(1, 65))
    assert signal_name(0) == "SIG0" and signal_name(200) == "SIG200"
    assert signal_number("usr2") == signal.SIGUSR2 and signal_number("SIGNOPE") is None


# ---------------------------------------------------------------------- snapshot + events


def _view(model: RunModel) -> dict[int, tuple[Any, ...]]:
    return {r.rank: (r.state, r.exit_code, r.signal, r.step, r.total, r.metrics, r.last_line,
                     r.pid, r.evidence) for r in model.ranks.values()}


def _verdict(model: RunModel) -> Any:
    return model.verdict.verdict if model.verdict else None


def test_a_viewer_from_a_mid_run_snapshot_sees_what_a_full_viewer_sees(tmp_path: Path) -> None:
    argv = [sys.executable, rank_script("progress_then_fail.py")]
    session = Session(make_plan(tmp_path, argv, 3, run_id="snap"))
    clock = lambda: 2_000_000_000.0  # noqa: E731  one injected clock for both viewers
    full = RunModel("snap", argv, 3, clock)
    late = RunModel("snap", argv, 3, clock)
    session.subscribe(full.apply)
    taken: list[ev.RunSnapshot] = []

    def take() -> None:  # between two engine callbacks: a consistent moment
        if not taken:
            taken.append(session.snapshot())
            late.restore(taken[0])
            session.subscribe(late.apply)

    def watch(event: ev.Event) -> None:
        if isinstance(event, ev.RankProgressed) and (event.step or 0) >= 3 and not taken:
            asyncio.get_running_loop().call_soon(take)

    session.subscribe(watch)
    ending = asyncio.run(session.run())
    assert taken and any(r.step for r in taken[0].ranks) and taken[0].verdict is None
    final = session.snapshot()  # the grace a viewer shows: the stop's own once it began
    assert taken[0].stop is None and taken[0].grace == session.plan.spec.grace
    assert final.stop is not None and final.grace == final.stop.grace
    assert ending.verdict.code == 2 and ending.verdict.deciding_rank == 1
    assert _view(late) == _view(full)
    assert _verdict(late) == _verdict(full) == ending.verdict
    assert full.ranks[1].state is RankState.FAILED and full.ranks[0].state is RankState.KILLED
    # A viewer that arrives after the end starts from the final snapshot alone.
    after = RunModel("snap", argv, 3, clock)
    after.restore(from_wire(json.loads(json.dumps(to_wire(session.snapshot())))))
    assert _view(after) == _view(full) and _verdict(after) == ending.verdict
    assert after.state == full.state == "finished"


def test_a_rank_killed_by_signal_40_stops_its_peer_and_is_named(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "2", "--grace", "5", rank_script("die_of_signal.py"), "1",
                   "40"], tmp_path, timeout=50)
    out, err = run.output()
    assert run.proc.returncode == 2, err
    assert "Traceback" not in out + err
    envelope = run.envelope()
    assert envelope["decided_by"]["rank"] == 1 and envelope["decided_by"]["rule"] == 2
    assert "SIGRTMIN+6" in envelope["decided_by"]["explanation"]
    assert envelope["ranks"][1]["signal"] == "SIGRTMIN+6"
    peer = envelope["ranks"][0]
    assert peer["signalled_by_supervisor"] is True and peer["signal"] == "SIGTERM"
    assert "rank 1 killed by SIGRTMIN+6" in out


def test_the_channel_protocol_decodes_what_it_can_and_drops_the_rest() -> None:
    from forgelm_tui.channel import MessageKind, decode, encode

    message = decode(encode(3, MessageKind.PROGRESS, step=7, total="ten",
                            metrics={"loss": 0.5, "name": "x"}))
    assert message is not None
    assert (message.rank, message.kind, message.step, message.total, message.metrics) == (
        3, MessageKind.PROGRESS, 7, None, {"loss": 0.5})
    old = decode(b'{"rank": 1, "kind": "heartbeat", "t": 1.0}')  # a pre-0.2 helper: no "v"
    assert old is not None and old.kind is MessageKind.HEARTBEAT
    newer = decode(b'{"v": 2, "rank": 1, "kind": "gpu_report", "t": 1.0}')
    assert newer is not None and newer.kind is MessageKind.OTHER  # still a heartbeat
    for bad in (b"not json", b"[]", b'{"kind": "progress"}', b'{"rank": "0"}',
                b'{"rank": true, "kind": "progress"}'):
        assert decode(bad) is None


def test_a_grown_grace_moves_the_views_deadline_and_is_said() -> None:
    """GraceExtended: the TUI's countdown moves to the new deadline at once (not at the next
    StopCountdown) and a notice says why."""
    clock = lambda: 104.0  # noqa: E731
    model = RunModel("r1", ["python"], 2, clock)
    model.apply(ev.RunStopping(StopKind.CANCEL, "cancelled by SIGTERM to the supervisor",
                               "SIGTERM to the supervisor", 5.0, (0, 1), 100.0))
    assert model.seconds_left() == pytest.approx(1.0)
    why = "preempted: GraceTime 5 s + SLURM KillWait 10 s, less 5 s"
    model.apply(ev.GraceExtended(10.0, why, 103.0))
    assert model.seconds_left() == pytest.approx(6.0)
    assert model.stop is not None and model.stop.grace == 10.0
    assert model.notices[-1] == f"grace now 10 s: {why}"
