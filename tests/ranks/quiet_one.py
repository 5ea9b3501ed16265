"""Rank program: rank 0 works and prints for DURATION seconds; the others sit silent and idle
(as ForgeLM's rank 1 does at a barrier while rank 0 evaluates), then all exit 0.

argv: DURATION
"""

import os
import sys
import time

duration = float(sys.argv[1])
rank = int(os.environ["RANK"])
deadline = time.time() + duration
while time.time() < deadline:
    if rank == 0:
        print(f"rank 0 working, {deadline - time.time():.1f} s left", flush=True)
    time.sleep(0.5)
