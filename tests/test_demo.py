"""The built-in demo, headless: a real DDP (gloo) run that can misbehave on request."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

pytestmark = pytest.mark.timeout(90)


def test_demo_trains_and_exits_with_the_chosen_code(tmp_path: Path) -> None:
    run = run_cli(["demo", "--steps", "3", "--step-time", "0", "--exit-code", "4"], tmp_path,
                  timeout=80)
    out, _ = run.output()
    assert run.proc.returncode == 4
    assert "[rank 0] step 3/3 loss" in out and "[rank 1] step 3/3 loss" in out
    assert run.envelope()["mode"] == "demo"


def test_demo_failure_names_root_cause_with_its_traceback(tmp_path: Path) -> None:
    run = run_cli(["demo", "--steps", "50", "--step-time", "0.05", "--fail-rank", "1",
                   "--fail-step", "3", "--fail-code", "2", "--grace", "5"], tmp_path, timeout=80)
    out, _ = run.output()
    assert run.proc.returncode == 2
    envelope = run.envelope()
    assert envelope["root_cause_rank"] == 1
    rank1 = envelope["ranks"][1]
    assert rank1["exit_code"] == 2
    assert envelope["ranks"][0]["signalled_by_supervisor"] is True
    assert "stopping: rank 1 failed (exit 2)" in out
    assert "[forgelm-tui] exit 2 EXIT_TRAINING_ERROR (root cause: rank 1" in out


def test_demo_crash_leaves_its_traceback_in_the_envelope(tmp_path: Path) -> None:
    run = run_cli(["demo", "--steps", "50", "--step-time", "0.05", "--fail-rank", "1",
                   "--fail-step", "3", "--fail-raise", "--grace", "5"], tmp_path, timeout=80)
    assert run.proc.returncode == 2  # exit 1 with a traceback: a crash (issue 12)
    envelope = run.envelope()
    assert envelope["root_cause_rank"] == 1
    assert envelope["exception"] == {"rank": 1, "type": "RuntimeError",
                                     "message": "rank 1: simulated crash at step 3"}
    error = envelope["ranks"][1]["error"]
    assert error is not None
    assert "simulated crash at step 3" in error["message"]
    assert "RuntimeError" in error["traceback"] or "raise RuntimeError" in error["traceback"]


def test_cancelling_the_demo_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    import signal

    from conftest import start, wait_for

    run = start(["demo", "--nproc-per-node", "3", "--steps", "500", "--step-time", "0.05"],
                tmp_path)
    logs = [run.run_dir / f"rank-{r}.stdout.log" for r in range(3)]
    wait_for(lambda: all(p.exists() and "step 3/500" in p.read_text() for p in logs), 60,
             "every rank to train")
    run.signal(signal.SIGINT)  # an operator's Ctrl+C
    assert run.wait(30) == 2
    envelope = run.envelope()
    steps = [r["stopped_at_step"] for r in envelope["ranks"]]
    assert steps[0] is not None and len(set(steps)) == 1, steps
    for rank in envelope["ranks"]:
        assert rank["exit_code"] == 2 and rank["signalled_by_supervisor"] is True
        assert rank["progress"]["step"] == steps[0]
        assert rank["progress"]["total"] == 500
        assert rank["stopped_from_outside"] is False
    assert (run.run_dir / "demo-checkpoint.pt").exists()
    out, _ = run.output()
    assert f"rank 0: stopping together at step {steps[0]} (SIGTERM)" in out
