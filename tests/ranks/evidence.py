"""Rank program: progress evidence of each kind, and hangs that burn CPU or print.

argv: MODE MARKS [SECONDS]

Modes that report steps 1..5 (of 100) through the channel, then write MARKS/steps-RANK (the
wall time just after the last report):
- ``spin``: then rank 0 spins a core in a busy loop (a CUDA sync spinning in a hung collective)
  and rank 1 sleeps (blocked in the collective): never any step again;
- ``print``: then both print a line every 0.3 s: output, never a step;
- ``pause``: then a pause of SECONDS with ``heartbeat()`` every second (a long evaluation),
  then steps 6..8, exit 0.

Modes that report no step at all, for SECONDS, then exit 0:
- ``print-only``: rank 0 prints every 0.3 s, rank 1 sleeps silent;
- ``spin-only``: rank 0 spins silent, rank 1 sleeps silent.
"""

import os
import sys
import time
from pathlib import Path

from forgelm_tui.rank import heartbeat, report_progress

mode, marks = sys.argv[1], Path(sys.argv[2])
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
rank = int(os.environ["RANK"])


def steps(first: int, last: int) -> None:
    for step in range(first, last + 1):
        report_progress(step, 100, {"loss": 1.0 / step})
        time.sleep(0.1)


def spin(until: float) -> None:
    x = 0
    while time.monotonic() < until:
        x += 1


if mode in ("spin", "print", "pause"):
    steps(1, 5)
    (marks / f"steps-{rank}").write_text(repr(time.time()))
if mode == "spin":
    if rank == 0:
        spin(float("inf"))
    time.sleep(3600)
elif mode == "print":
    while True:
        print(f"rank {rank} still printing", flush=True)
        time.sleep(0.3)
elif mode == "pause":
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        heartbeat()
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    steps(6, 8)
elif mode == "print-only":
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if rank == 0:
            print(f"rank {rank} working", flush=True)
        time.sleep(0.3)
elif mode == "spin-only":
    if rank == 0:
        spin(time.monotonic() + seconds)
    else:
        time.sleep(seconds)
