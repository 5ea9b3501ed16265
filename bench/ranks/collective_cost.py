"""Bench rank: time N all-reduces of a tensor of SIZE floats over gloo; print one JSON line.

argv: SIZE N. Rank 0 prints {"size", "n", "per_op_us", "rss_mib"} after a warm-up of N/10.
Run by bench/collectives.py under torchrun, with and without the flight recorder and the
collectives watcher.
"""

import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

size, count = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
tensor = torch.ones(size)
for _ in range(max(1, count // 10)):
    dist.all_reduce(tensor)
start = time.perf_counter()
for _ in range(count):
    dist.all_reduce(tensor)
per_op = (time.perf_counter() - start) / count
if dist.get_rank() == 0:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"size": size, "n": count, "per_op_us": round(per_op * 1e6, 2),
                      "rss_mib": round(rss, 1), "fr": os.environ.get("TORCH_FR_BUFFER_SIZE")}),
          flush=True)
dist.destroy_process_group()
