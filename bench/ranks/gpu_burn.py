"""Rank program for bench/gpu_check.py (a real GPU machine only): hold GiB of memory on the
rank's GPU (cuda:LOCAL_RANK) and keep it busy with matmuls for SECONDS, then exit 0.

argv: GIB SECONDS [DIR]. With DIR, writes DIR/ready-RANK = "PID" once the memory is held.
"""

import os
import sys
import time

import torch

gib, seconds = float(sys.argv[1]), float(sys.argv[2])
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(device)
held = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=device)
a = torch.randn(4096, 4096, device=device)
torch.cuda.synchronize()
if len(sys.argv) > 3:
    path = os.path.join(sys.argv[3], f"ready-{os.environ.get('RANK', '0')}")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
end = time.monotonic() + seconds
while time.monotonic() < end:
    b = a @ a
    torch.cuda.synchronize()
del held, b
