"""Rank program for the TUI bench: record pid and parent pid, then train at a steady pace.

argv: DIR SECONDS [STEPS_PER_S] [--graceful]. Writes DIR/ready-RANK = "PID PPID" as
sleeper.py does, then for SECONDS reports a step (of 100,000) and a falling, noisy loss on the
channel and prints ``step N/T loss X``, STEPS_PER_S (10) times a second, as the demo does: what
the TUI's bars, pace and curves are fed. Exits 0, after SECONDS or as soon as DIR/stop exists
(bench/scale.py ends a run when its window is measured). When DIR/fail exists, the last rank
writes its ``time.time()`` to DIR/failed-at and exits 2 at once (bench/scale.py's failure
fan-out). ``--graceful``: a SIGTERM ends the rank at the end of its current step, exit 0, as a
trainer that finishes its step first does (without it the default action: it dies at once).
"""

import math
import os
import random
import signal
import sys
import time

from forgelm_tui.rank import report_progress

out, seconds = sys.argv[1], float(sys.argv[2])
rate = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
stopped: list[int] = []
if "--graceful" in sys.argv[4:]:
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
rank = int(os.environ["RANK"])
path = os.path.join(out, f"ready-{rank}")
with open(path + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {os.getppid()}")
os.replace(path + ".tmp", path)
noise = random.Random(rank)
start = time.monotonic()
step = 0
stop, fail = os.path.join(out, "stop"), os.path.join(out, "fail")
last = rank == int(os.environ.get("WORLD_SIZE", "1")) - 1
while (elapsed := time.monotonic() - start) < seconds:
    if stopped or (step % 4 == 0 and os.path.exists(stop)):
        break
    if last and os.path.exists(fail):
        with open(os.path.join(out, "failed-at"), "w") as handle:
            handle.write(repr(time.time()))
        os._exit(2)
    step += 1
    loss = round(0.5 + 2.0 * math.exp(-step / 300) + noise.random() * 0.1, 4)
    report_progress(step, 100_000, {"loss": loss})
    print(f"step {step}/100000 loss {loss}", flush=True)
    time.sleep(max(0.0, step / rate - (time.monotonic() - start)))
