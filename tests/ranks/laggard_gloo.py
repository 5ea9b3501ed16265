"""Rank program: a gloo loop in which the last rank stops taking part, or takes a long pause.

argv: MODE [STEPS]. Every rank all-reduces a tensor every 0.1 s, printing a banner and a line
every 10 steps. After STEPS (10) steps the last rank (the *laggard*):
- ``silent``: sleeps, printing nothing; its peers wait in their next all_reduce;
- ``chatty``: loops on ``time.sleep(0.01)`` while a background thread prints twice a second:
  its output moves, its stack changes, and it never enters the collective its peers wait in;
- ``spin``: spins a core in a Python loop, printing nothing;
- ``pause``: a collective-free phase of 6 s (an evaluation on one rank) that prints and sends
  a heartbeat from its main thread every 0.5 s while its peers wait in a barrier; then every
  rank trains 10 more steps and exits 0.
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
laggard = rank == world - 1
if os.environ.get("PLAY_NCCL_RECORDER") == "1":  # torch's NCCL dump pipe, played (no NCCL here)
    import nccl_recorder_double

    nccl_recorder_double.start(rank)
print(f"rank {rank}: training, mode {mode}", flush=True)
value = torch.ones(1)


def train(count: int) -> None:
    for step in range(count):
        dist.all_reduce(value)
        if step % 10 == 0:
            print(f"rank {rank}: step {step}", flush=True)
        time.sleep(0.1)


def chatter() -> None:
    while True:
        print(f"rank {rank}: still here (a background thread)", flush=True)
        time.sleep(0.5)


train(steps)
if laggard and mode == "silent":
    time.sleep(3600)
elif laggard and mode == "chatty":
    threading.Thread(target=chatter, daemon=True).start()
    while True:
        time.sleep(0.01)
elif laggard and mode == "spin":
    while True:
        pass
elif mode == "pause":
    if laggard:
        from forgelm_tui.rank import heartbeat

        for second in range(12):
            print(f"rank {rank}: evaluating, batch {second}", flush=True)
            heartbeat()
            time.sleep(0.5)
    dist.barrier()
    train(10)
else:
    train(3600)
dist.destroy_process_group()
print(f"rank {rank}: done ({os.getpid()})", flush=True)
