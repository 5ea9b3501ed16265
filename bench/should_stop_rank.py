"""Rank side of the should_stop() cost benchmark (run by bench/should_stop.py under forgelm-tui).

argv: CALLS OUT_JSON
Times, per call: StopAgreement.should_stop() every step, every 10 steps, and a bare one-int
gloo all_reduce as the floor; and the same loop with no check at all.
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from forgelm_tui.rank import StopAgreement

calls, out = int(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")


def per_call(fn, n: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for step in range(n):
        fn(step)
    dist.barrier()
    return (time.perf_counter() - start) / n * 1e6


flag = torch.zeros(1, dtype=torch.int32)


def bare(step: int) -> None:
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)


results: dict[str, list[float]] = {"none": [], "all_reduce": [], "every_1": [], "every_10": []}
for _ in range(5):
    results["none"].append(per_call(lambda s: None, calls))
    results["all_reduce"].append(per_call(bare, calls))
    with StopAgreement(every=1) as stop:
        results["every_1"].append(per_call(stop.should_stop, calls))
    with StopAgreement(every=10) as stop:
        results["every_10"].append(per_call(stop.should_stop, calls))
if rank == 0:
    summary = {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
               for k, v in results.items()}
    with open(out, "w") as handle:
        json.dump({"calls": calls, "world_size": dist.get_world_size(), "results": summary},
                  handle, indent=2)
dist.destroy_process_group()
