"""Rank program for the TUI bench: record pid and parent pid, then sleep.

argv: DIR SECONDS. Writes DIR/ready-RANK = "PID PPID" (the parent is the supervisor, which
is how bench/tui.py finds the forgelm-tui process), then ``time.sleep(SECONDS)`` and exits 0.
"""

import os
import sys
import time

out, seconds = sys.argv[1], float(sys.argv[2])
path = os.path.join(out, f"ready-{os.environ['RANK']}")
with open(path + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {os.getppid()}")
os.replace(path + ".tmp", path)
time.sleep(seconds)
