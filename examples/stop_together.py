"""A plain torch.distributed training loop that stops together and reports progress.

    forgelm-tui --nproc-per-node 2 examples/stop_together.py
    torchrun --nproc-per-node 2 examples/stop_together.py      # works too: no channel, no-op

Press Ctrl+C (or send SIGTERM to forgelm-tui, or to any one rank): every rank leaves the loop
at the same step, rank 0 saves a checkpoint, and nobody deadlocks in the next all-reduce.
"""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from forgelm_tui.rank import StopAgreement, report_progress


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    total = 10_000
    with StopAgreement(every=1) as stop:  # records SIGTERM / SIGINT; never a collective
        print(f"rank {rank}: training for {total} steps", flush=True)
        for step in range(1, total + 1):
            loss = model(torch.randn(32, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            report_progress(step, total, {"loss": loss.item()})
            if stop.should_stop(step):  # the same call on every rank: one all-reduce decides
                if rank == 0:
                    path = os.path.join(os.environ.get("FORGELM_TUI_RUN_DIR", "."), "ckpt.pt")
                    torch.save({"step": step, "model": model.module.state_dict()}, path)
                print(f"rank {rank}: stopped together at step {step} ({stop.reason})", flush=True)
                dist.destroy_process_group()
                return 2  # the run did not complete
            time.sleep(0.01)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
