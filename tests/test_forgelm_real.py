"""The real ForgeLM 0.11.1 on 2 CPU ranks under forgelm-tui, with a tiny offline model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from forgelm_job import job_env, make_job

pytestmark = [pytest.mark.forgelm, pytest.mark.timeout(240)]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from forgelm_job import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-model")


def test_two_rank_forgelm_awaiting_approval(tmp_path: Path, tiny_model: Path) -> None:
    job = make_job(tmp_path / "job", require_human_approval=True, model_dir=tiny_model)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "forgelm_tui", "--no-tui", "--nproc-per-node", "2",
         "--run-dir", str(run_dir), "--output-format", "json",
         "--config", str(job.config)],
        cwd=job.dir, env=job_env(job.dir), capture_output=True, text=True, timeout=220,
    )
    assert proc.returncode == 4, proc.stderr[-3000:]
    envelope = json.loads(proc.stdout)
    assert envelope["exit_code"] == 4
    assert envelope["exit_name"] == "EXIT_AWAITING_APPROVAL"
    assert envelope["mode"] == "forgelm"
    assert envelope["rank_command"][-2:] == ["--output-format", "json"]
    assert envelope["result"]["awaiting_approval"] is True
    assert envelope["result"]["success"] is True
    assert envelope["result"]["staging_path"].startswith(str(job.output_dir))
    rank_results = [r["forgelm_result"] for r in envelope["ranks"]]
    assert all(r and r["awaiting_approval"] for r in rank_results)
    assert rank_results[0]["run_id"] != rank_results[1]["run_id"]  # ForgeLM has no rank awareness
    last_exit = job.output_dir / "last_exit.json"
    assert json.loads(last_exit.read_text()) == envelope
    assert json.loads((run_dir / "envelope.json").read_text()) == envelope
