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
from conftest import rank_script, start
from stop_checks import assert_interrupted_from_outside, assert_stopped_together

pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(75)
DEADLINE = 60  # from launch to the supervisor's exit, on a loaded 2-core machine


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


def test_single_process_without_a_process_group(tmp_path: Path) -> None:
    """In this process, no torch.distributed group: the callback still stops (and saves) at the
    signalled step, and puts the SIGTERM handler back."""
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from forgelm_tui.rank.hf import StopTogetherCallback

    stop = StopTogetherCallback()

    class SigtermAtStep3(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 3:
                # Only ever to the callback's handler: never to this process's own.
                assert signal.getsignal(signal.SIGTERM) == stop.stop._on_signal
                os.kill(os.getpid(), signal.SIGTERM)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        ids = torch.randint(0, 32, (40, 8), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=20, per_device_train_batch_size=2,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    before = signal.getsignal(signal.SIGTERM)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
                      callbacks=[SigtermAtStep3(), stop])
    trainer.train()
    assert trainer.state.global_step == 3 and stop.stopped_at_step == 3
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-3"]
    assert signal.getsignal(signal.SIGTERM) == before


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
