"""Rank program for a scheduler's signals, which reach the ranks directly as well as the
supervisor. Writes MARKS/ready-RANK (its pid and its blocked-signal mask) once set up, appends
a line to MARKS/usr1-RANK for each SIGUSR1, and on the first SIGTERM runs a cleanup of SECONDS
(a checkpoint write) in ``except Exception``, writing MARKS/cleanup-RANK when done, then exits 2
as ForgeLM does. Its own SIGTERM handler only raises once (later SIGTERMs are the same request);
with --runner the graceful runner's is used instead. A rank in NO_HANDLER has no SIGTERM handler:
it dies of the first. With --gloo it joins a gloo group first and all-reduces every 0.2 s (a
job across real nodes); the cleanup uses no collective.

argv: MARKS SECONDS NO_HANDLER (comma-separated ranks, or -) [--runner] [--gloo] [--usr1-late S]
(--usr1-late: its SIGUSR1 handler comes S seconds after the ready mark, as a program that
installs it late, Lightning at ``fit``)
"""

import os
import signal
import sys
import time

marks, seconds, no_handler = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rank = int(os.environ["RANK"])
own_handler = "--runner" not in sys.argv and str(rank) not in no_handler.split(",")


class Stop(Exception):
    pass


def on_term(signum, frame):
    signal.signal(signal.SIGTERM, lambda *_: None)  # the burst's repeats: the same request
    raise Stop("SIGTERM")


def on_usr1(signum, frame):
    with open(os.path.join(marks, f"usr1-{rank}"), "a") as handle:
        handle.write(f"{time.time()}\n")


if own_handler:
    signal.signal(signal.SIGTERM, on_term)
reduce = None
if "--gloo" in sys.argv:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)

    def reduce():
        dist.all_reduce(value)

late = float(sys.argv[sys.argv.index("--usr1-late") + 1]) if "--usr1-late" in sys.argv else 0.0
if not late:
    signal.signal(signal.SIGUSR1, on_usr1)
with open("/proc/self/status") as status:
    blocked = status.read().split("SigBlk:")[1].split()[0]
with open(os.path.join(marks, f"ready-{rank}.tmp"), "w") as handle:
    handle.write(f"{os.getpid()} {blocked}")
os.replace(os.path.join(marks, f"ready-{rank}.tmp"), os.path.join(marks, f"ready-{rank}"))
if late:
    time.sleep(late)
    signal.signal(signal.SIGUSR1, on_usr1)
try:
    while True:
        if reduce is not None:
            reduce()
            time.sleep(0.2)
        else:
            time.sleep(0.05)
except Exception as exc:
    print(f"rank {rank}: {type(exc).__name__}, cleanup ({seconds:g} s)", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    with open(os.path.join(marks, f"cleanup-{rank}"), "w") as handle:
        handle.write("done")
    print(f"rank {rank}: cleanup finished", flush=True)
    sys.exit(2)
