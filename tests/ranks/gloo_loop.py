"""Rank program: join a gloo group and all-reduce a tensor every 50 ms until killed (no SIGTERM
handler: a signal ends it at once, and its peers see the connection close mid-collective).

argv: MARKS. Writes MARKS/ready-RANK (its pid) once in the group.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

marks = sys.argv[1]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
with open(os.path.join(marks, f"ready-{rank}.tmp"), "w") as handle:
    handle.write(str(os.getpid()))
os.replace(os.path.join(marks, f"ready-{rank}.tmp"), os.path.join(marks, f"ready-{rank}"))
value = torch.ones(1)
while True:
    dist.all_reduce(value)
    time.sleep(0.05)
