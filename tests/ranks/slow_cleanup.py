"""Rank program: works (a line a tenth of a second) until SIGTERM, then runs a cleanup that takes
SECONDS (a checkpoint write, as the demo's --cleanup-seconds), prints "cleanup finished" and
exits 2. Torch-free: for tests about how a stop is delivered, not about training.

argv: MARKS SECONDS. Writes MARKS/ready-RANK (its pid) once its handler is in place.
"""

import os
import signal
import sys
import time

marks, seconds = sys.argv[1], float(sys.argv[2])
rank = int(os.environ["RANK"])
stopping = False


def on_term(signum, frame):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(marks, f"ready-{rank}.tmp"), "w") as handle:
    handle.write(str(os.getpid()))
os.replace(os.path.join(marks, f"ready-{rank}.tmp"), os.path.join(marks, f"ready-{rank}"))
step = 0
while not stopping:
    step += 1
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.1)
print(f"rank {rank}: cleanup started ({seconds:g} s)", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    time.sleep(0.05)
print(f"rank {rank}: cleanup finished", flush=True)
sys.exit(2)
