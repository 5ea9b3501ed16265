"""bench/launchers.py's rank: marks its start; the last rank exits 7 after 1 s (marking when),
the others mark the SIGTERM that stops them and exit 143. Torch-free."""

import os
import signal
import sys
import time

marks = os.environ["MARKS"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def mark(name: str) -> None:
    with open(os.path.join(marks, name + ".mark"), "w") as handle:
        handle.write(repr(time.time()))


def stopped(*_: object) -> None:
    mark(f"term-{rank}")
    sys.exit(143)


signal.signal(signal.SIGTERM, stopped)
mark(f"start-{rank}")
if rank == world - 1:
    time.sleep(1.0)
    mark("failed")
    os._exit(7)
while True:
    time.sleep(0.05)
