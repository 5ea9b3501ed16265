"""The demo rank program: a tiny regression model trained with DDP over gloo on the CPU.

Runs under forgelm-tui (or torchrun) and can misbehave on request, so every behaviour of the
supervisor can be seen with one command: a rank exiting with a chosen code at a chosen step,
a rank hanging (the others block in the next all-reduce), a rank ignoring SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

with warnings.catch_warnings():
    # torch warns at import when NumPy is absent (the quick start installs none); the demo never
    # uses NumPy, and the warning would be the first, red, stderr line of every rank.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.nn.parallel import DistributedDataParallel

from forgelm_tui.rank import StopAgreement, collectives, report_progress
from forgelm_tui.rank.channel import default_channel


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="forgelm_tui.demo.train")
    for name, default in (("steps", 30), ("fail-rank", None), ("fail-code", 2),
                          ("fail-step", 10), ("hang-rank", None), ("hang-step", 10),
                          ("ignore-sigterm-rank", None), ("exit-code", 0)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--cleanup-seconds", type=float, default=0.0)
    parser.add_argument("--fail-raise", action="store_true")
    return parser.parse_args(argv)


def say(rank: int, text: str) -> None:
    del rank  # every rank prints; forgelm-tui prefixes the rank
    print(text, flush=True)


def stuck_forever(rank: int, why: str) -> None:
    say(rank, f"rank {rank}: {why}; now stuck")
    while True:
        time.sleep(3600)


def clean_up(rank: int, seconds: float) -> None:
    """A slow cleanup after a stop (a big checkpoint, an upload): start, progress, end."""
    if seconds <= 0:
        return
    say(rank, f"rank {rank}: cleanup started ({seconds:g} s)")
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        say(rank, f"rank {rank}: cleanup {max(0.0, end - time.monotonic()):.0f} s left")
    say(rank, f"rank {rank}: cleanup finished")


def leave_together(code: int) -> None:
    """Every rank meets here, then the process ends. No destroy_process_group: a rank tearing
    the gloo group down while its peer's process is ending aborts ("Connection closed by peer",
    or "terminate called without an active exception", SIGABRT): a failure nobody made, which
    the verdict would take for a root cause (issue 12).

    After the barrier no rank has a collective left, and ``os._exit`` runs no C++ destructor
    (the process group's, the store client's), so a peer's sockets closing has nothing left to
    abort. Rank 0 does not wait for its peers to be gone first: it hosts the TCPStore, but no
    one needs it past the barrier, and waiting would only move the same window onto rank 0,
    whose code is the run's. bench/demo_race.py checks it under load (bench/RESULTS.md)."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def save_checkpoint(model: nn.Module, step: int) -> Path:
    run_dir = Path(os.environ.get("FORGELM_TUI_RUN_DIR", "."))
    path = run_dir / "demo-checkpoint.pt"
    torch.save({"step": step, "model": model.state_dict()}, path)
    return path


@record  # type: ignore[untyped-decorator]  # torch is Any to mypy (pyproject.toml)
def main() -> int:
    opts = parse(sys.argv[1:])
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    stubborn = opts.ignore_sigterm_rank == rank
    dist.init_process_group("gloo")
    collectives.install(default_channel().send)  # what the observed runner does for others
    torch.manual_seed(1234 + rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = nn.Linear(16, 1)
    if rank == 0:
        say(rank, f"demo: {world} ranks, gloo on CPU, {opts.steps} steps")
    with StopAgreement() as stop:
        for step in range(1, opts.steps + 1):
            if opts.fail_rank == rank and step == opts.fail_step:
                if opts.fail_raise:
                    raise RuntimeError(f"rank {rank}: simulated crash at step {step}")
                say(rank, f"rank {rank}: failing on purpose at step {step} with exit "
                          f"{opts.fail_code}")
                print(f"rank {rank}: simulated failure", file=sys.stderr, flush=True)
                sys.stdout.flush()
                # Out at once, as a crash is: a Python teardown would first close the gloo
                # sockets, and a peer aborting on "Connection closed by peer" could be reaped
                # before this rank, taking the root cause (a collateral failure; issue 12).
                os._exit(int(opts.fail_code))
            if opts.hang_rank == rank and step == opts.hang_step:
                stuck_forever(rank, f"stops taking part at step {step}")
            x = torch.randn(64, 16)
            with torch.no_grad():
                y = target(x)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces gradients here
            optimizer.step()
            say(rank, f"step {step}/{opts.steps} loss {loss.item():.4f}")
            report_progress(step, opts.steps, {"loss": round(loss.item(), 4)})
            if stop.should_stop(step):  # every rank agrees here, at the same step
                if stubborn:
                    stuck_forever(rank, f"ignores the stop at step {step}")
                if rank == 0:
                    say(rank, f"saved {save_checkpoint(model.module, step)}")
                clean_up(rank, opts.cleanup_seconds)
                say(rank, f"rank {rank}: stopping together at step {step} ({stop.reason})")
                leave_together(2)  # 2: as ForgeLM reports an interrupted run
            time.sleep(opts.step_time)
    if rank == 0:
        say(rank, f"demo: done, exiting with {opts.exit_code}")
    leave_together(int(opts.exit_code))
    return int(opts.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
