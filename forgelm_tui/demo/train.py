"""The demo rank program: a tiny regression model trained with DDP over gloo on the CPU.

Runs under forgelm-tui (or torchrun) and can misbehave on request, so every behaviour of the
supervisor can be seen with one command: a rank exiting with a chosen code at a chosen step,
a rank hanging (the others block in the next all-reduce), a rank ignoring SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="forgelm_tui.demo.train")
    for name, default in (("steps", 30), ("fail-rank", None), ("fail-code", 2),
                          ("fail-step", 10), ("hang-rank", None), ("hang-step", 10),
                          ("ignore-sigterm-rank", None), ("exit-code", 0)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--fail-raise", action="store_true")
    return parser.parse_args(argv)


def say(rank: int, text: str) -> None:
    del rank  # every rank prints; forgelm-tui prefixes the rank
    print(text, flush=True)


def ignore_sigterm(rank: int) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        say(rank, f"rank {rank}: got SIGTERM and ignores it (the supervisor will SIGKILL)")

    signal.signal(signal.SIGTERM, handler)


def stuck_forever(rank: int, why: str) -> None:
    say(rank, f"rank {rank}: {why}; now stuck")
    while True:
        time.sleep(3600)


@record
def main() -> int:
    opts = parse(sys.argv[1:])
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if opts.ignore_sigterm_rank == rank:
        ignore_sigterm(rank)
    dist.init_process_group("gloo")
    torch.manual_seed(1234 + rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = nn.Linear(16, 1)
    if rank == 0:
        say(rank, f"demo: {world} ranks, gloo on CPU, {opts.steps} steps")
    for step in range(1, opts.steps + 1):
        if opts.fail_rank == rank and step == opts.fail_step and opts.fail_raise:
            raise RuntimeError(f"rank {rank}: simulated crash at step {step}")
        if opts.fail_rank == rank and step == opts.fail_step:
            say(rank, f"rank {rank}: failing on purpose at step {step} with exit {opts.fail_code}")
            print(f"rank {rank}: simulated failure", file=sys.stderr, flush=True)
            raise SystemExit(opts.fail_code)
        if opts.hang_rank == rank and step == opts.hang_step:
            stuck_forever(rank, f"stops taking part at step {step}")
        x = torch.randn(64, 16)
        with torch.no_grad():
            y = target(x)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        try:
            loss.backward()  # type: ignore[no-untyped-call]  # DDP all-reduces the gradients here: every rank must be present
        except RuntimeError as exc:
            if opts.ignore_sigterm_rank == rank:
                stuck_forever(rank, f"lost its peers ({str(exc).splitlines()[0]})")
            raise
        optimizer.step()
        say(rank, f"step {step}/{opts.steps} loss {loss.item():.4f}")
        time.sleep(opts.step_time)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        say(rank, f"demo: done, exiting with {opts.exit_code}")
    return int(opts.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
