"""The real ForgeLM 0.11.1 on 2 CPU ranks: every rank shows its real training step and a healthy
run with ``--stall-timeout`` is never stalled.

The graceful runner adds the progress callback to ForgeLM's Trainer (ForgeLM unchanged): both
ranks report their steps on the channel and send heartbeats while ForgeLM evaluates (a baseline
before training, ``auto_revert``), evaluates and saves every 10 steps, and evaluates after
training. Without it, rank 1 showed a datasets ``map`` bar (``7/7``) and rank 0 its last
evaluation's bar (``1/1``) as their training progress. The run is in this process (a Session,
as the CLI builds it) so that every progress event can be checked, not only the last.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from forgelm_job import job_env, make_job

from forgelm_tui.engine import events as ev
from forgelm_tui.plan import Planner
from forgelm_tui.run import Session

pytestmark = [pytest.mark.forgelm, pytest.mark.timeout(240)]
STEPS = 40


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from forgelm_job import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-model")


def test_forgelm_ranks_show_their_training_step_and_are_not_stalled(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # learning rate 0.02: the final eval loss beats the baseline by far more than the noise
    # (0.06 against 0.005), so auto_revert's gate passes and the run ends with 4.
    job = make_job(tmp_path / "job", model_dir=tiny_model, max_steps=STEPS, extra={
        "training": {"eval_steps": 10, "save_steps": 10, "learning_rate": 0.02},
        "evaluation": {"auto_revert": True}})
    for name, value in job_env(job.dir, {}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(job.dir)
    plan = Planner(["--no-tui", "--nproc-per-node", "2", "--stall-timeout", "15",
                    "--run-dir", str(tmp_path / "run"), "--config", str(job.config)],
                   "forgelm-progress").plan()
    session = Session(plan)
    progress: list[ev.RankProgressed] = []
    session.subscribe(lambda e: progress.append(e) if isinstance(e, ev.RankProgressed) else None)
    ending = asyncio.run(session.run())

    envelope = ending.envelope
    assert ending.verdict.code == 4, (envelope["decided_by"], envelope["stop"])
    assert envelope["stop"] is None
    for rank in envelope["ranks"]:
        assert rank["stalled"] is False and rank["progress_evidence"] == "steps"
        assert rank["progress"]["source"] == "channel"
        assert (rank["progress"]["step"], rank["progress"]["total"]) == (STEPS, STEPS)
    for rank in (0, 1):  # never a data-processing or evaluation bar taken for the step
        shown = {(e.total, e.source) for e in progress if e.rank == rank and e.step is not None}
        assert shown == {(STEPS, ev.ProgressSource.CHANNEL)}, shown
    log = (tmp_path / "run" / "rank-0.stderr.log").read_text()
    assert "| 1/1 [" in log and f"| {STEPS}/{STEPS} [" in log  # the bars were there to be read
