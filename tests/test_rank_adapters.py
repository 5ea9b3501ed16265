"""Stop together inside HF Trainer ranks: a real 2-rank Trainer run under forgelm-tui.

The model is a random-weight 1-layer GPT-2 with a 64-token vocabulary built in the rank
(tests/ranks/hf_job.py); nothing is downloaded. A SIGTERM reaches ONE rank only; with
``forgelm_tui.rank.hf.StopTogetherCallback`` every rank saves and stops at the same global step,
and forgelm-tui reports the run as interrupted (rule 4) by the rank that was signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import rank_script, ready_pids, start

pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(75)
DEADLINE = 60  # from launch to the supervisor's exit, on a loaded 2-core machine


def _done(marks: Path, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((marks / f"done-{rank}").read_text())
    return data


def _assert_stopped_together(envelope: dict[str, Any], marks: Path, step: int,
                             signalled: int) -> None:
    assert envelope["exit_code"] == 2, envelope["decided_by"]
    assert envelope["decided_by"]["rule"] == 4, (envelope["decided_by"], [
        (r["rank"], r["exit_code"], r["signal"], r["stderr_tail"]) for r in envelope["ranks"]])
    assert envelope["decided_by"]["rank"] == signalled
    assert envelope["outside_signal"] == {"rank": signalled, "signal": "SIGTERM",
                                          "ranks": [signalled]}
    for record in envelope["ranks"]:
        rank = record["rank"]
        assert record["exit_code"] == 0 and record["signal"] is None, record
        assert record["signalled_by_supervisor"] is False
        assert record["stopped_at_step"] == step, record
        assert record["progress"]["step"] == step and record["progress"]["source"] == "channel"
        assert record["progress"]["total"] == 300
        assert isinstance(record["progress"]["metrics"]["loss"], float)
        assert record["stopped_from_outside"] is (rank == signalled)
        assert record["reported_signal"] == ("SIGTERM" if rank == signalled else None)
        done = _done(marks, rank)
        assert done["global_step"] == step and done["stopped_at_step"] == step, done
        assert done["stopped"] is True
        assert done["sigterm_handler_restored"] is True
    # HF Trainer saved a checkpoint at the agreed step before stopping.
    checkpoint = marks / "out" / f"checkpoint-{step}"
    assert (checkpoint / "trainer_state.json").exists()
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    assert sorted(p.name for p in (marks / "out").iterdir()) == [f"checkpoint-{step}"]


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(tmp_path: Path,
                                                                marks: Path) -> None:
    """Rank 1 sends itself SIGTERM at step 5; rank 0 is never signalled."""
    begin = time.monotonic()
    run = start(["--nproc-per-node", "2", "--grace", "20", rank_script("hf_job.py"), str(marks),
                 "--term-rank", "1", "--term-step", "5"], tmp_path)
    assert run.wait(DEADLINE) == 2
    assert time.monotonic() - begin < DEADLINE
    out, _ = run.output()
    assert "[rank 1] rank 1: sending myself SIGTERM at step 5" in out
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank}: train returned at global step 5" in out
    assert "rank 1 stopped on a signal from outside" in out
    envelope = run.envelope()
    _assert_stopped_together(envelope, marks, 5, signalled=1)
    assert envelope["stop"] is None  # the ranks stopped themselves; the supervisor sent nothing
    assert all(r["signals_sent"] == [] for r in envelope["ranks"])


def test_sigterm_from_outside_to_rank_0_with_agreement_every_2_steps(tmp_path: Path,
                                                                     marks: Path) -> None:
    """The test SIGTERMs rank 0's pid mid-training; the ranks agree every 2nd step."""
    begin = time.monotonic()
    run = start(["--nproc-per-node", "2", "--grace", "20", rank_script("hf_job.py"), str(marks),
                 "--every", "2"], tmp_path)
    pids = ready_pids(marks, 2)
    os.kill(pids[0], signal.SIGTERM)
    assert run.wait(DEADLINE) == 2
    assert time.monotonic() - begin < DEADLINE
    envelope = run.envelope()
    step = envelope["ranks"][0]["stopped_at_step"]
    assert isinstance(step, int) and step % 2 == 0 and 2 <= step < 300, step
    _assert_stopped_together(envelope, marks, step, signalled=0)


def test_single_process_without_a_process_group(tmp_path: Path, marks: Path) -> None:
    """No torch.distributed group: the callback still stops (and saves) at the signalled step."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, rank_script("hf_job.py"), str(marks), "--term-rank",
                           "0", "--term-step", "3"], env=env, capture_output=True, text=True,
                          timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = _done(marks, 0)
    assert done["global_step"] == 3 and done["stopped_at_step"] == 3
    assert done["checkpoints"] == ["checkpoint-3"]
    assert done["sigterm_handler_restored"] is True


def test_latest_loss_reads_the_newest_logged_loss() -> None:
    from forgelm_tui.rank.hf import latest_loss

    history = [{"loss": 3.0, "step": 1}, {"loss": 2.5, "step": 2}, {"eval_loss": 9.0, "step": 2}]
    assert latest_loss(history) == 2.5
    assert latest_loss([]) is None
    assert latest_loss([{"train_loss": 1.0}]) is None


@pytest.mark.timeout(60)
def test_importing_the_rank_helpers_imports_no_training_library() -> None:
    code = ("import sys, forgelm_tui.rank, forgelm_tui.rank.graceful; "
            "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning') "
            "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
