"""Reports steps through the channel and prints; rank 1 fails with 7 at step 6, the others
wait to be stopped (a peer blocked in the next collective)."""

import os
import time

from forgelm_tui.rank import report_progress

rank = int(os.environ["RANK"])
for step in range(1, 7):
    print(f"rank {rank} step {step}", flush=True)
    report_progress(step, 10, {"loss": 1.0 / step})
    time.sleep(0.05)
if rank == 1:
    raise SystemExit(7)
time.sleep(60)
