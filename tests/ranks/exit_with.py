"""Rank program: print a line, optionally wait, exit with a code.

argv: CODE [RANK_CODE ...] as rank=code pairs, e.g. ``2 1=4`` (default 2, rank 1 exits 4);
``--sleep S`` waits before exiting; ``--sleep-rank R=S`` waits only on rank R.
"""

import os
import sys
import time

rank = int(os.environ["RANK"])
code = 0
sleep = 0.0
args = sys.argv[1:]
i = 0
while i < len(args):
    arg = args[i]
    if arg == "--sleep":
        sleep = float(args[i + 1])
        i += 2
        continue
    if arg == "--sleep-rank":
        r, s = args[i + 1].split("=")
        if int(r) == rank:
            sleep = float(s)
        i += 2
        continue
    if "=" in arg:
        r, c = arg.split("=")
        if int(r) == rank:
            code = int(c)
    else:
        code = int(arg)
    i += 1
print(f"rank {rank} of {os.environ['WORLD_SIZE']} says hello", flush=True)
if sleep:
    time.sleep(sleep)
print(f"rank {rank} exiting with {code}", flush=True)
sys.exit(code)
