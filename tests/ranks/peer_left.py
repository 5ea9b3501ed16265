"""Two gloo ranks under the graceful runner, stopped at different moments (as two nodes are):
rank 0 waits in an all_reduce that rank 1, out of its loop, never enters. The test sends
SIGTERM to rank 1 alone: leaving its process group, it must free rank 0 at once (rank 0's
``except`` sees the failed collective while rank 1 is still in its cleanup). Then SIGTERM to
rank 0 in the middle of that cleanup: it must not be raised there, but in the loop after it.
Each cleanup waits for MARKS/release, which the test writes once it has seen what it needs.
With ``ddp``, both ranks hold a DistributedDataParallel model (its reducer keeps the group, and
so its connections, alive after ``destroy_process_group``) and rank 0 waits in DDP's gradient
all_reduce, inside ``backward``.

argv: MARKS [ddp]
"""

import os
import sys
import time

import torch
import torch.distributed as dist

marks = sys.argv[1]
ddp = sys.argv[2:] == ["ddp"]
rank = int(os.environ["RANK"])


def mark(name: str, text: str = "") -> None:
    with open(os.path.join(marks, f"{name}-{rank}.tmp"), "w") as handle:
        handle.write(text)
    os.replace(os.path.join(marks, f"{name}-{rank}.tmp"), os.path.join(marks, f"{name}-{rank}"))


def cleanup() -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(marks, "release")) and time.monotonic() < deadline:
        time.sleep(0.02)
    mark("cleanup", "done")


dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
if ddp:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()  # together once: the reducer is built
if rank == 0:
    mark("ready", str(os.getpid()))
    try:
        if ddp:
            model(torch.ones(2, 4)).sum().backward()  # its all_reduce: rank 1 never comes
        else:
            dist.all_reduce(value)  # rank 1 never comes
    except Exception as exc:
        mark("caught", f"{type(exc).__name__}: {exc}")
        cleanup()  # the SIGTERM the test sends now waits for the end of this
try:
    if rank == 1:  # inside the try: the test's SIGTERM may come right after the mark
        mark("ready", str(os.getpid()))
    while True:
        time.sleep(0.02)
except Exception as exc:
    mark("stopped", f"{type(exc).__name__}: {exc}")
    if rank == 1:
        cleanup()
    sys.exit(2)
