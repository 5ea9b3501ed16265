"""Rank program: join a gloo group; rank FAIL_RANK exits FAIL_CODE, the others wait in a barrier.

argv: FAIL_RANK FAIL_CODE
"""

import os
import sys

import torch.distributed as dist

fail_rank, fail_code = int(sys.argv[1]), int(sys.argv[2])
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
print(f"rank {rank} joined the group", flush=True)
if rank == fail_rank:
    print(f"rank {rank} failing with {fail_code}", file=sys.stderr, flush=True)
    os._exit(fail_code)
dist.barrier()
print(f"rank {rank} passed the barrier (unexpected)", flush=True)
