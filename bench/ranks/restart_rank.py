"""A rank for bench/restart.py: marks when it starts and ends (its own clock: one machine).

argv: MARKS VICTIM. Each start is ``start-RANK-N`` (N: how many times this rank started, so
torchrun's agents, whose restart count differs per node, are read alike), each end
``end-RANK-N``, holding ``time.time()``. Rank VICTIM exits 9 after 1.5 s the first time only;
every other rank waits to be stopped (SIGTERM: marks its end, exits 143) in the first start,
and exits 0 after 1 s in a later one.
"""

import os
import signal
import sys
import time
from pathlib import Path

marks, victim = Path(sys.argv[1]), int(sys.argv[2])
rank = int(os.environ["RANK"])
start = time.time()
n = len(list(marks.glob(f"start-{rank}-*")))
(marks / f"start-{rank}-{n}").write_text(repr(start))


def end(code: int) -> None:
    (marks / f"end-{rank}-{n}").write_text(repr(time.time()))
    os._exit(code)


signal.signal(signal.SIGTERM, lambda *_: end(143))
first = not (marks / "crashed").exists()
if rank == victim and first:
    time.sleep(1.5)
    (marks / "crashed").write_text("1")
    end(9)
time.sleep(60 if first else 1.0)
end(0)
