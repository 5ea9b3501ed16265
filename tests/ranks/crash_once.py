"""Rank R fails the first N times it runs (counted in a marker file), then succeeds.

argv: MARKS RANK HOW [N]: HOW is ``exit:CODE`` or ``signal:NUMBER``; N (default 1) how many
times it fails (``always``: every time; ``hang``: never, every rank sleeps until stopped).
Every rank records its attempt as torchrun's variables say it (``env-<rank>-<restart
count>``, its MASTER_PORT in ``port-<rank>-<restart count>``); the other ranks end with 0
after half a second.
"""

import os
import resource
import signal
import sys
import time
from pathlib import Path

marks, victim, how = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
times = sys.argv[4] if len(sys.argv) > 4 else "1"
rank = int(os.environ["RANK"])
count = os.environ["TORCHELASTIC_RESTART_COUNT"]
(marks / f"env-{rank}-{count}").write_text(os.environ["TORCHELASTIC_MAX_RESTARTS"])
(marks / f"port-{rank}-{count}").write_text(os.environ["MASTER_PORT"])
print(f"rank {rank} attempt {count}", flush=True)
if rank != victim or times == "hang":  # "hang": every rank waits to be stopped
    time.sleep(0.5 if times != "hang" else 60)
    sys.exit(0)
marker = marks / "crashes"
crashes = int(marker.read_text()) if marker.exists() else 0
if times == "always" or crashes < int(times):
    marker.write_text(str(crashes + 1))
    time.sleep(0.2)
    kind, _, value = how.partition(":")
    if kind == "exit":
        sys.exit(int(value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(int(value), signal.SIG_DFL)
    os.kill(os.getpid(), int(value))
    time.sleep(10)
sys.exit(0)
