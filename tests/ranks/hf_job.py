"""Rank program: a tiny HF Trainer DDP job (random GPT-2, tiny vocab, CPU, gloo), no downloads.

argv: DIR [--steps N] [--step-time S] [--every K] [--no-callback] [--term-rank R --term-step K]

Writes DIR/ready-RANK (its pid) once training has run two steps, and DIR/done-RANK (JSON: the
global step it ended at, the agreed stop step, the checkpoints saved, whether the SIGTERM
handler was restored) when ``train()`` returns. ``--term-rank R --term-step K``: rank R sends
itself SIGTERM at the end of optimizer step K; no other rank is signalled.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--step-time", type=float, default=0.03)
parser.add_argument("--every", type=int, default=1)
parser.add_argument("--logging-steps", type=int, default=1)
parser.add_argument("--no-callback", action="store_true")
parser.add_argument("--term-rank", type=int, default=None)
parser.add_argument("--term-step", type=int, default=5)
opts = parser.parse_args()
rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
hf_logging.set_verbosity_error()


def mark(name: str, text: str) -> None:
    path = os.path.join(opts.dir, f"{name}-{rank}")
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, count: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class Marks(TrainerCallback):
    """Paces the steps, writes the ready file, sends the SIGTERM (before StopTogetherCallback)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(opts.step_time)  # paces the run so that training is still going when tested
        if state.global_step == 2:
            mark("ready", str(os.getpid()))
        if rank == opts.term_rank and state.global_step == opts.term_step:
            print(f"rank {rank}: sending myself SIGTERM at step {state.global_step}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)


config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                    bos_token_id=0, eos_token_id=0)
torch.manual_seed(0)
model = GPT2LMHeadModel(config)
out = os.path.join(opts.dir, "out")
args = TrainingArguments(
    output_dir=out, per_device_train_batch_size=2, max_steps=opts.steps, learning_rate=1e-3,
    logging_steps=opts.logging_steps, save_strategy="no", report_to="none", use_cpu=True,
    ddp_backend="gloo" if world > 1 else None,
    disable_tqdm=True, dataloader_num_workers=0, seed=0, ddp_find_unused_parameters=False,
)
callbacks: list[TrainerCallback] = [Marks()]
stop_callback = None
if not opts.no_callback:
    from forgelm_tui.rank.hf import StopTogetherCallback

    stop_callback = StopTogetherCallback(every=opts.every)
    callbacks.append(stop_callback)
data = RandomTokens(opts.steps * 2 * world, 16, config.vocab_size)
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
print(f"rank {rank}: training, world size {args.world_size}", flush=True)
trainer.train()
done = {
    "global_step": trainer.state.global_step,
    "stopped": stop_callback.stopped if stop_callback else None,
    "stopped_at_step": stop_callback.stopped_at_step if stop_callback else None,
    "checkpoints": sorted(os.listdir(out)) if os.path.isdir(out) else [],
    "sigterm_handler_restored": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
}
mark("done", json.dumps(done))
print(f"rank {rank}: train returned at global step {trainer.state.global_step}: {done}",
      flush=True)
if torch.distributed.is_initialized():
    # Leave together: a rank still in a collective while its peer's process ends aborts
    # ("Connection closed by peer"), a failure of its own that the test did not inject.
    torch.distributed.barrier()
    sys.stderr.flush()
    os._exit(0)
sys.exit(0)
