"""Rank program: a tiny Lightning DDP job (CPU, gloo) under forgelm-tui's torchrun environment.

argv: DIR [--steps N] [--step-time S] [--callback] [--ckpt] [--term-rank R --term-step K]
          [--pause-step P]

Writes DIR/ready-RANK (its pid) once training has run two steps, and DIR/done-RANK (JSON: the
global step it ended at, whether our callback stopped it, the checkpoint) when ``fit`` returns.
``--callback`` adds forgelm_tui.rank.lightning.StopTogetherCallback; ``--ckpt``: it saves
DIR/stopped-step={step}.ckpt when the ranks stop together. ``--term-rank R --term-step K``:
rank R sends itself SIGTERM at the end of step K (no other rank is signalled).
``--pause-step P``: at the end of step P every rank waits (outside any collective) until
DIR/go exists, writing DIR/got-term-RANK once it has taken a SIGTERM: a test can then signal
the ranks one by one, in a known order, at a known step. (Single-process Lightning, and a
training step that raises: in the test's own process, tests/test_lightning.py.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")  # Lightning's hints about workers and sync_dist
logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--step-time", type=float, default=0.05)
parser.add_argument("--callback", action="store_true")
parser.add_argument("--term-rank", type=int, default=None)
parser.add_argument("--term-step", type=int, default=5)
parser.add_argument("--ckpt", action="store_true")
parser.add_argument("--pause-step", type=int, default=None)
opts = parser.parse_args()
rank = int(os.environ.get("RANK", "0"))


def mark(name: str, text: str) -> None:
    path = os.path.join(opts.dir, f"{name}-{rank}")
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        time.sleep(opts.step_time)  # paces the run so a signal lands mid-training
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def took_sigterm(trainer: pl.Trainer) -> bool:
    if stop_callback is not None:
        return stop_callback.stop.requested
    return trainer.received_sigterm  # Lightning's own handler ran


def pause(trainer: pl.Trainer, step: int) -> None:
    print(f"rank {rank}: paused at step {step}", flush=True)
    go = os.path.join(opts.dir, "go")
    deadline = time.monotonic() + 60
    marked = False
    while not os.path.exists(go):
        if not marked and took_sigterm(trainer):
            mark("got-term", str(step))
            marked = True
        if time.monotonic() > deadline:
            print(f"rank {rank}: nobody said go", flush=True)
            os._exit(3)
        time.sleep(0.01)


class Marks(pl.Callback):
    """Ready file at step 2; self-sent SIGTERM, pause (both before StopTogetherCallback)."""

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step == 2:
            mark("ready", str(os.getpid()))
        if rank == opts.term_rank and step == opts.term_step:
            print(f"rank {rank}: sending myself SIGTERM at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        if step == opts.pause_step:
            pause(trainer, step)


torch.manual_seed(0)
data = TensorDataset(torch.randn(opts.steps * 4, 8), torch.randn(opts.steps * 4, 1))
callbacks: list[pl.Callback] = [Marks()]
stop_callback = None
if opts.callback:
    from forgelm_tui.rank.lightning import StopTogetherCallback

    ckpt = os.path.join(opts.dir, "stopped-step={step}.ckpt") if opts.ckpt else None
    stop_callback = StopTogetherCallback(checkpoint_path=ckpt)
    callbacks.append(stop_callback)
trainer = pl.Trainer(
    accelerator="cpu", devices=2, strategy="ddp",
    max_steps=opts.steps, max_epochs=1, callbacks=callbacks, logger=False,
    enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False, num_sanity_val_steps=0, use_distributed_sampler=True,
)
print(f"rank {rank}: fitting, world size {trainer.world_size}", flush=True)
trainer.fit(Tiny(), DataLoader(data, batch_size=2))
done = {
    "global_step": trainer.global_step,
    "stopped": stop_callback.stopped if stop_callback else None,
    "stopped_at_step": stop_callback.stopped_at_step if stop_callback else None,
    "checkpoint": stop_callback.checkpoint if stop_callback else None,
    "interrupted": trainer.interrupted,
    "sigterm_handler_restored": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    # read back from the file Lightning wrote (here, so the test needs no torch of its own)
    "checkpoint_global_step": (torch.load(stop_callback.checkpoint, weights_only=False)
                               ["global_step"] if stop_callback and stop_callback.checkpoint
                               else None),
}
mark("done", json.dumps(done))
print(f"rank {rank}: fit returned at global step {trainer.global_step}: {done}", flush=True)
if torch.distributed.is_available() and torch.distributed.is_initialized():
    # Leave together: a rank still in a collective while its peer's process ends aborts
    # ("Connection closed by peer"), a failure of its own that the test did not inject.
    torch.distributed.barrier()
    sys.stderr.flush()
    os._exit(0)
sys.exit(0)
