"""Progress sources ranked by what they prove (SPEC §4, docs/progress.md).

A rank that reported steps progresses only when its step moves on or its main thread sends a
heartbeat: spinning a core or printing is no progress for it (a GPU hang spins in a CUDA sync).
Output counts for ranks that report no steps; CPU time only for ranks that showed neither. Only
a *training* bar is a step: real HF Trainer, datasets and Lightning output
(tests/fixtures/progress/) is replayed through the engine.

The rules run in-process on the policy's injected clock; real rank processes check the wiring.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from conftest import Run, make_plan, rank_script, start
from policy_harness import Harness, harness

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import ProgressEvidence
from forgelm_tui.engine.progress_lines import Bar, parse_bar
from forgelm_tui.engine.records import Evidence
from forgelm_tui.session.run import Session
from forgelm_tui.tui.model import RankRow, RunModel
from forgelm_tui.tui.widgets.rank_table import progress_cell
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(60)
FIXTURES = Path(__file__).parent / "fixtures" / "progress"
STEPS, OUTPUT, CPU = ProgressEvidence.STEPS, ProgressEvidence.OUTPUT, ProgressEvidence.CPU


# ---------------------------------------------------------------------- the rules, in-process


def _live(h: Harness, seconds: float, **signs: Evidence) -> None:
    """``seconds`` of a run, a sample pass a second: each rank named (``r0=...``) shows that
    sign of life every second, and the policy checks progress after each pass."""
    for _ in range(int(seconds)):
        h.advance(1.0)
        for name, evidence in signs.items():
            h.records[int(name[1:])].saw(evidence, h.clock.now)
        h.policy.progress_checked(h.clock.now)


def test_a_rank_that_reported_steps_and_spins_or_prints_is_stalled() -> None:
    h = harness(2, stall_timeout=5.0, grace=2.0)
    for record in h.records.values():
        record.saw(Evidence.STEP, h.clock.now)
        record.step, record.total = 5, 100
    _live(h, 4, r0=Evidence.CPU, r1=Evidence.OUTPUT)
    assert h.policy.stop is None
    _live(h, 1, r0=Evidence.CPU, r1=Evidence.OUTPUT)
    assert h.policy.stop is not None and h.policy.stop.kind is StopKind.STALL
    assert [r.progress_evidence for r in h.records.values()] == [STEPS, STEPS]


def test_steps_and_heartbeats_keep_a_steps_rank_alive() -> None:
    h = harness(2, stall_timeout=3.0)
    h.records[0].saw(Evidence.STEP, h.clock.now)
    h.records[1].saw(Evidence.STEP, h.clock.now)
    _live(h, 20, r0=Evidence.HEARTBEAT)  # a 20 s evaluation on rank 0, rank 1 waits at a barrier
    assert h.policy.stop is None
    assert [r.quiet for r in h.records.values()] == [False, True]  # one idle rank: only marked
    _live(h, 20, r1=Evidence.STEP)
    assert h.policy.stop is None
    assert [r.quiet for r in h.records.values()] == [True, False]


def test_output_counts_for_a_rank_without_steps_but_not_its_cpu() -> None:
    h = harness(2, stall_timeout=3.0)
    _live(h, 10, r0=Evidence.OUTPUT, r1=Evidence.CPU)
    assert h.policy.stop is None
    assert [r.progress_evidence for r in h.records.values()] == [OUTPUT, CPU]
    _live(h, 3, r0=Evidence.CPU, r1=Evidence.OUTPUT)  # rank 0 now only spins; rank 1 prints
    assert h.policy.stop is None  # rank 1's output counts: it is an output rank now
    _live(h, 3, r0=Evidence.CPU, r1=Evidence.CPU)  # both only burn CPU: neither is a CPU rank
    assert h.policy.stop is not None and h.policy.stop.kind is StopKind.STALL


def test_cpu_time_counts_only_for_a_rank_that_showed_nothing_stronger() -> None:
    h = harness(1, stall_timeout=3.0)
    _live(h, 10, r0=Evidence.CPU)
    assert h.policy.stop is None and h.records[0].progress_evidence is CPU


def test_once_its_steps_reach_the_total_a_rank_s_output_counts_again_never_its_cpu() -> None:
    h = harness(1, stall_timeout=3.0)
    record = h.records[0]
    record.saw(Evidence.STEP, h.clock.now)
    record.step, record.total = 100, 100  # training over: saving, post-training evaluation...
    _live(h, 10, r0=Evidence.OUTPUT)
    assert h.policy.stop is None and record.progress_evidence is STEPS and record.steps_done
    _live(h, 3, r0=Evidence.CPU)
    assert h.policy.stop is not None


def test_the_level_is_announced_once_and_snapshots_carry_what_views_were_told() -> None:
    h = harness(2, stall_timeout=30.0)
    h.records[0].saw(Evidence.CPU, h.clock.now)
    h.records[0].saw(Evidence.OUTPUT, h.clock.now)
    assert h.records[0].snapshot().progress_evidence is None  # not told yet
    h.policy.progress_checked(h.clock.now)
    h.records[0].saw(Evidence.CPU, h.clock.now)  # weaker: the level stays
    h.policy.progress_checked(h.clock.now)
    assert h.effects.of(ev.RankEvidenceChanged) == [ev.RankEvidenceChanged(0, OUTPUT)]
    assert h.records[0].snapshot().progress_evidence is OUTPUT
    assert h.records[1].snapshot().progress_evidence is None


def test_the_progress_cell_names_what_a_rank_s_progress_is_judged_by() -> None:
    assert progress_cell(RankRow(0, step=3, total=10, evidence=STEPS)) == ("3/10", "")
    assert progress_cell(RankRow(0, evidence=OUTPUT)) == ("output", "dim")
    assert progress_cell(RankRow(0, evidence=CPU)) == ("cpu", "dim")
    assert progress_cell(RankRow(0, metrics={"loss": 0.5}, evidence=OUTPUT)) == (
        "loss 0.5 · output", "")
    assert progress_cell(RankRow(0)) == ("", "")
    model = RunModel("r", ["x"], 2, lambda: 0.0)  # what the TUI shows comes from the events
    model.apply(ev.RankEvidenceChanged(1, CPU))
    assert progress_cell(model.ranks[1]) == ("cpu", "dim")


# ---------------------------------------------------------------------- which bar is a step


def _segments(name: str) -> list[bytes]:
    """Every line of a captured file as the terminal redrew it: one piece per redraw."""
    data = (FIXTURES / name).read_bytes()
    return [piece for line in data.split(b"\n") for piece in line.split(b"\r")]


def _bars(name: str) -> list[Bar]:
    return [bar for bar in map(parse_bar, _segments(name)) if bar is not None]


def test_hf_trainer_bars_training_evaluation_and_data_processing() -> None:
    rank1 = _bars("forgelm-rank1.stderr.log")  # ForgeLM's rank 1: no Trainer bar at all
    assert {b.label for b in rank1} == {"Loading weights"}  # a loop; "examples/s" bars are not
    assert not any(bar.is_training(None) for bar in rank1)
    rank0 = _bars("forgelm-rank0.stderr.log")
    assert {b.total for b in rank0 if b.label == "" and not b.nested} == {1, 30}
    assert {b.total for b in rank0 if b.nested} == {1}  # evaluations drawn under the training bar
    assert max(b.total for b in rank0 if b.is_training(30)) == 30
    assert not any(b.is_training(30) for b in rank0 if b.total == 1)
    plain = parse_bar(b" 40%|####      | 2/5 [00:01<00:01, 1.9it/s]")
    assert plain == Bar("", 2, 5) and plain.is_training(None)
    assert parse_bar(b"Map: 100%|##########| 4/4 [00:00<00:00, 100.00 examples/s]") is None
    slow = parse_bar(b" 10%|#         | 24/240 [01:02<09:18, 2.59s/it]")
    assert slow is not None and slow.is_training(None)
    download = b"model.safetensors: 100%|##########| 5/5 [00:01<00:00, 4.1MB/s]"
    assert parse_bar(download) is None


def test_lightning_tqdm_bars_epoch_is_training_validation_is_not() -> None:
    bars = _bars("lightning-tqdm.stdout.log")
    training = [b for b in bars if b.is_training(None)]
    assert {b.label for b in training} == {"Epoch 0", "Epoch 1"} and training[-1].step == 10
    others = {b.label for b in bars if not b.is_training(None)}
    assert others == {"Sanity Checking DataLoader 0", "Validation DataLoader 0"}


def test_real_output_replayed_only_training_bars_become_steps(tmp_path: Path) -> None:
    files = ["forgelm-rank0.stderr.log", "forgelm-rank1.stderr.log", "lightning-tqdm.stdout.log"]
    argv = [sys.executable, rank_script("replay_output.py"), *(str(FIXTURES / f) for f in files)]
    session = Session(make_plan(tmp_path, argv, 3))
    seen: list[ev.RankProgressed] = []
    session.subscribe(lambda e: seen.append(e) if isinstance(e, ev.RankProgressed) else None)
    ending = asyncio.run(session.run())
    assert ending.verdict.code == 0
    steps = {rank: [(e.step, e.total) for e in seen if e.rank == rank and e.step is not None]
             for rank in range(3)}
    assert steps[1] == []  # a rank that prints no training bar shows no step
    first = next(i for i, (_, total) in enumerate(steps[0]) if total == 30)
    assert {total for _, total in steps[0][:first]} <= {1}  # a baseline evaluation, before
    training = steps[0][first:]  # ...then the training bar only, never an evaluation's
    assert {total for _, total in training} == {30} and training == sorted(training)
    assert training[-1] == (30, 30)
    assert {total for _, total in steps[2]} == {10} and steps[2][-1] == (10, 10)
    envelope = ending.envelope
    assert [r["progress_evidence"] for r in envelope["ranks"]] == ["steps", "output", "steps"]
    assert envelope["ranks"][1]["progress"] is None


# ---------------------------------------------------------------------- real rank processes


def _last_step_at(marks: Path) -> float:
    return max(float((marks / f"steps-{rank}").read_text()) for rank in (0, 1))


def _evidence_runs(tmp_path: Path, args: list[str], modes: list[str], *extra: str
                   ) -> dict[str, tuple[Run, Path]]:
    """One run of tests/ranks/evidence.py per mode, all at once (they share nothing)."""
    runs = {}
    for mode in modes:
        marks = tmp_path / mode / "marks"
        marks.mkdir(parents=True)
        runs[mode] = (start(["--nproc-per-node", "2", *args, rank_script("evidence.py"), mode,
                             str(marks), *extra], tmp_path / mode), marks)
    return runs


def test_steps_then_a_spinning_or_printing_hang_is_a_stall(tmp_path: Path) -> None:
    """Two ranks report steps 1-5, then rank 0 spins a core and rank 1 sleeps (or both print):
    a stall, within stall + grace + a little of the last step report. (A short stall timeout:
    the rule's timing is proven on the injected clock above; this checks the wiring.)"""
    runs = _evidence_runs(tmp_path, ["--stall-timeout", "2", "--grace", "1"], ["spin", "print"])
    for mode, (run, marks) in runs.items():
        assert run.wait(40) == 2, mode
        ended = time.time()
        after = ended - _last_step_at(marks)
        assert 2 - 0.5 <= after <= 2 + 1 + 3, (mode, after)
        envelope = run.envelope()
        assert envelope["stop"]["kind"] == "stall" and envelope["exit_code"] == 2
        for rank in envelope["ranks"]:
            assert rank["stalled"] is True and rank["progress_evidence"] == "steps"
            assert rank["progress"]["step"] == 5 and rank["progress"]["source"] == "channel"
        assert envelope["ranks"][0]["signal"] == "SIGTERM"  # the spinning rank died of the stop


def test_heartbeats_output_or_cpu_keep_a_rank_from_stalling(tmp_path: Path) -> None:
    """Three runs at once, 4 s each (twice the stall timeout): steps, then a pause (an
    evaluation) with a heartbeat every second; output only, or CPU only, on rank 0."""
    evidence = {"pause": "steps", "print-only": "output", "spin-only": "cpu"}
    runs = _evidence_runs(tmp_path, ["--stall-timeout", "2", "--grace", "2"], list(evidence),
                          "4")
    for mode, (run, _) in runs.items():
        assert run.wait(40) == 0, mode
        envelope = run.envelope()
        assert envelope["stop"] is None
        if mode == "pause":
            for rank in envelope["ranks"]:
                assert rank["stalled"] is False and rank["progress_evidence"] == "steps"
                assert rank["progress"]["step"] == 8
        else:
            assert envelope["ranks"][0]["progress_evidence"] == evidence[mode]
            assert envelope["ranks"][0]["progress"] is None
