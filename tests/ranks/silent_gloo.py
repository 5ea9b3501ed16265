"""Rank program: a healthy gloo loop that prints one banner and then trains silently.

argv: SECONDS [STEP_TIME]. Every rank all-reduces a tensor every STEP_TIME (0.1 s) for SECONDS,
printing nothing after its banner (as a loop that logs every 500 steps), then exits 0. Under
forgelm-tui its only evidence of progress after the banner is its collectives
(docs/progress.md, "Collectives").
"""

import os
import sys
import time

import torch
import torch.distributed as dist

seconds = float(sys.argv[1])
step_time = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
dist.init_process_group("gloo")
print(f"rank {os.environ['RANK']}: training for {seconds:g} s", flush=True)
value = torch.ones(1)
# Every rank runs the same number of steps: a rank that left by its own clock would leave its
# peer waiting in a collective it never enters.
for _ in range(max(1, round(seconds / step_time))):
    dist.all_reduce(value)
    time.sleep(step_time)
dist.destroy_process_group()
