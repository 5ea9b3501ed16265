"""Rank program for bench/gpu_hang_check.py: an NCCL loop on cuda:LOCAL_RANK.

argv: MODE SECONDS [BACKEND]. Every rank all-reduces a 1 MiB tensor and reads it back
(``.item()``: the CUDA synchronisation a training loop's loss read makes) every 0.05 s,
printing one banner and nothing after it. ``healthy``: SECONDS of that, then exit 0.
``chatty``: after 3 s the last rank stops taking part and loops on ``time.sleep(0.01)`` while
a thread prints; its peers block in their next read of the all-reduced tensor. BACKEND
``gloo``: the same on CPU tensors (bench/gpu_hang_check.py --dry-run: the check's own flow on
a CPU machine).
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist

mode, seconds = sys.argv[1], float(sys.argv[2])
backend = sys.argv[3] if len(sys.argv) > 3 else "nccl"
local = int(os.environ["LOCAL_RANK"])
if backend == "nccl":
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    device = f"cuda:{local}"
else:
    dist.init_process_group(backend)
    device = "cpu"
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank}: {backend} on {device}, {mode} for {seconds:g} s", flush=True)
value = torch.ones(1 << 18, device=device)
began = time.monotonic()
steps = max(1, round(seconds / 0.05))
for _ in range(steps):
    if mode == "chatty" and rank == world - 1 and time.monotonic() - began > 3:
        def chatter() -> None:
            while True:
                print(f"rank {rank}: still here (a background thread)", flush=True)
                time.sleep(0.5)
        threading.Thread(target=chatter, daemon=True).start()
        while True:
            time.sleep(0.01)
    dist.all_reduce(value)
    value.div_(world)
    _ = value[0].item()
    time.sleep(0.05)
dist.destroy_process_group()
