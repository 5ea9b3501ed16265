"""Stop together inside HF Trainer ranks: a real 2-rank Trainer run under forgelm-tui.

The model is a random-weight 1-layer GPT-2 with a 64-token vocabulary built in the rank
(tests/ranks/hf_job.py); nothing is downloaded. A SIGTERM reaches ONE rank only; with
``forgelm_tui.rank.hf.StopTogetherCallback`` every rank saves and stops at the same global step,
and forgelm-tui reports the run as interrupted (rule 4) by the rank that was signalled.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import rank_script, start
from stop_checks import assert_interrupted_from_outside, assert_stopped_together

# Not imported here (importorskip would): collecting this file costs no import of transformers
# (seconds of CPU in every xdist worker); the ranks import it.
pytestmark = [pytest.mark.timeout(150), pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers")]
# From launch to the supervisor's exit, on a loaded 2-core machine: the SLURM tests' jobs start
# with the session (some 40 torch imports at once), and an HF rank imports transformers.
DEADLINE = 120


def test_sigterm_to_one_rank_stops_every_rank_at_the_next_agreement(tmp_path: Path,
                                                                    marks: Path) -> None:
    """Rank 1 sends itself SIGTERM at step 5; rank 0 is never signalled. The ranks agree every
    2nd step: the handler only records it, and every rank stops (and saves) at step 6."""
    begin = time.monotonic()
    run = start(["--nproc-per-node", "2", "--grace", "20", rank_script("hf_job.py"), str(marks),
                 "--every", "2", "--term-rank", "1", "--term-step", "5"], tmp_path)
    assert run.wait(DEADLINE) == 2
    assert time.monotonic() - begin < DEADLINE
    out, _ = run.output()
    assert "[rank 1] rank 1: sending myself SIGTERM at step 5" in out
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank}: train returned at global step 6" in out
    assert "rank 1 stopped on a signal from outside" in out
    envelope = run.envelope()
    # The ranks stopped themselves: the supervisor sent nothing (stop None, no signals sent).
    assert_interrupted_from_outside(envelope, first=1, signalled={1})
    assert_stopped_together(envelope, marks, 6, total=300)
    # HF Trainer saved a checkpoint at the agreed step before stopping, and no other.
    checkpoint = marks / "out" / "checkpoint-6"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 6
    assert sorted(p.name for p in (marks / "out").iterdir()) == ["checkpoint-6"]


@pytest.mark.timeout(60)
def test_importing_the_rank_helpers_imports_no_training_library() -> None:
    code = ("import sys, forgelm_tui.rank, forgelm_tui.rank.graceful; "
            "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning') "
            "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
