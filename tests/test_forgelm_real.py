"""The real ForgeLM 0.11.1 on CPU ranks under forgelm-tui, with a tiny offline model."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from forgelm_job import job_env, make_job, recording_cli_cmd

STEP = re.compile(r"\|\s*([2-9]|[1-9]\d+)/\d+ \[")  # HF's tqdm bar past its first step
STEPS = 20  # the approval run: evaluated and saved every 10 steps
pytestmark = [pytest.mark.forgelm, pytest.mark.timeout(240)]


def test_cancelled_forgelm_leaves_pipeline_failed_and_its_result(tmp_path: Path,
                                                                 tiny_model: Path) -> None:
    """SIGTERM to the supervisor mid-training: the graceful runner turns it into an exception
    in ForgeLM's main thread, so ForgeLM writes ``pipeline.failed`` and its result and exits 2.
    One rank: the same stop reaching every rank together is the wiring other tests prove
    (test_demo, test_stop_together); this one proves what the real ForgeLM does with it."""
    from conftest import wait_for
    from forgelm_job import read_audit_log

    job = make_job(tmp_path / "job", long=True, model_dir=tiny_model)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "forgelm_tui", "--no-tui", "--nproc-per-node", "1",
         "--run-dir", str(run_dir), "--grace", "20", "--config", str(job.config)],
        cwd=job.dir, env=job_env(job.dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        def training() -> bool:
            events = read_audit_log(job.output_dir) if job.audit_log.exists() else []
            started = [e for e in events if e["event"] == "training.started"]
            log = run_dir / "rank-0.stderr.log"
            return len(started) == 1 and log.exists() and bool(STEP.search(log.read_text()))

        wait_for(training, 150, "the rank to be training", step=0.2)
        proc.send_signal(signal.SIGTERM)  # as a scheduler cancels a job
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    envelope = json.loads((run_dir / "envelope.json").read_text())
    assert envelope["cancelled"]["by"] == "SIGTERM to the supervisor"
    assert envelope["settings"]["graceful"] is True
    events = read_audit_log(job.output_dir)
    run_ids = {e["run_id"] for e in events if e["event"] == "training.started"}
    failed = {e["run_id"] for e in events if e["event"] == "pipeline.failed"}
    assert len(run_ids) == 1
    assert run_ids <= failed, (run_ids, failed)
    for rank in envelope["ranks"]:
        assert rank["exit_code"] == 2, rank  # ForgeLM's own exit after a caught stop
        assert rank["forgelm_result"] is not None and rank["forgelm_result"]["success"] is False


def test_two_ranks_of_forgelm_awaiting_approval_show_every_training_step(
        tmp_path: Path, tiny_model: Path) -> None:
    """2 ranks under one supervisor (the common case: one machine, several GPUs), ``--output-format
    json``: the supervisor returns 4 (awaiting approval) where torchrun returns 1, writes the
    envelope, also as last_exit.json where the output dir is, and prints it as JSON on stdout.
    The same contract across nodes (every node's supervisor returns the same code and writes the
    same envelope) is test_multinode.py's, on the demo's gloo ranks.

    Progress: the graceful runner adds the progress callback to ForgeLM's Trainer (ForgeLM
    unchanged), so both ranks report their steps on the channel and send heartbeats while
    ForgeLM evaluates (a baseline before training, ``auto_revert``), evaluates and saves every
    10 steps, and evaluates after training: with ``--stall-timeout`` the run is never stalled.
    Without it, rank 1 showed a datasets ``map`` bar (``7/7``) and rank 0 its last evaluation's
    bar (``1/1``) as their training progress: every progress event of the session is recorded
    (forgelm_job.recording_cli_cmd), not only the last.
    """
    # learning rate 0.02: the final eval loss beats the baseline by far more than the noise,
    # so auto_revert's gate passes and the run ends with 4.
    job = make_job(tmp_path / "job", require_human_approval=True, model_dir=tiny_model,
                   max_steps=STEPS, extra={
                       "training": {"eval_steps": 10, "save_steps": 10, "learning_rate": 0.02},
                       "evaluation": {"auto_revert": True}})
    events = tmp_path / "events.jsonl"
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        recording_cli_cmd(events, "--no-tui", "--nproc-per-node", "2", "--stall-timeout", "15",
                          "--run-dir", str(run_dir), "--output-format", "json",
                          "--config", str(job.config)),
        cwd=job.dir, env=job_env(job.dir), capture_output=True, text=True, timeout=220)
    assert proc.returncode == 4, proc.stderr[-3000:]
    envelope = json.loads((run_dir / "envelope.json").read_text())
    assert json.loads(proc.stdout) == envelope  # stdout: the envelope only
    assert envelope["exit_code"] == 4
    assert envelope["exit_name"] == "EXIT_AWAITING_APPROVAL"
    assert envelope["mode"] == "forgelm"
    assert envelope["rank_command"][-2:] == ["--output-format", "json"]
    assert envelope["result"]["awaiting_approval"] is True
    assert envelope["result"]["success"] is True
    assert envelope["result"]["staging_path"].startswith(str(job.output_dir))
    assert envelope["stop"] is None, (envelope["decided_by"], envelope["stop"])
    assert [r["rank"] for r in envelope["ranks"]] == [0, 1]
    rank_results = [r["forgelm_result"] for r in envelope["ranks"]]
    assert all(r and r["awaiting_approval"] for r in rank_results)
    assert rank_results[0]["run_id"] != rank_results[1]["run_id"]  # ForgeLM has no rank awareness
    last_exit = json.loads((job.output_dir / "last_exit.json").read_text())
    assert last_exit == envelope and last_exit["nnodes"] == 1
    for rank in envelope["ranks"]:
        assert rank["stalled"] is False and rank["progress_evidence"] == "steps", rank
        assert rank["progress"]["source"] == "channel"
        assert (rank["progress"]["step"], rank["progress"]["total"]) == (STEPS, STEPS)
    seen = [json.loads(line) for line in events.read_text().splitlines()]
    shown = {(e["total"], e["source"]) for e in seen if e["step"] is not None}
    # never a data-processing or evaluation bar taken for the step
    assert {e["rank"] for e in seen} == {0, 1} and shown == {(STEPS, "channel")}, shown
    log = (run_dir / "rank-0.stderr.log").read_text()  # HF draws its bars on local rank 0
    assert "| 1/1 [" in log and f"| {STEPS}/{STEPS} [" in log  # they were there to be read


def test_forgelm_config_error_stays_1(tmp_path: Path) -> None:
    """ForgeLM's own deliberate exit 1 (a config it rejects, no traceback) is not a crash.

    One rank: with two, the first rank's exit 1 is a failure that stops the other, which under
    load can be mid-validation and never print the JSON result this test reads."""
    (tmp_path / "bad.yaml").write_text("training:\n  output_dir: out\n"
                                       "  num_train_epochs: lots\n")
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "forgelm_tui", "--no-tui", "--nproc-per-node", "1",
         "--run-dir", str(run_dir), "--output-format", "json", "--config", "bad.yaml"],
        cwd=tmp_path, env=job_env(tmp_path), capture_output=True, text=True, timeout=220,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    envelope = json.loads(proc.stdout)
    assert envelope["exit_name"] == "EXIT_CONFIG_ERROR" and envelope["exception"] is None
    assert "Configuration validation failed" in envelope["result"]["error"]
