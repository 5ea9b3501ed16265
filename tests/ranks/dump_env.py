"""Rank program: writes its argv and environment to $DUMP_DIR/rank-<RANK>.json (``single``
without RANK: accelerate's one-process launcher), waits for every rank's file (WORLD_SIZE),
then exits with the code $DUMP_EXIT gives its rank (``0=4,1=3``, ``1=SEGV``; default 0).
$DUMP_WAIT_RANK=R: rank R waits for SIGTERM instead (exit 143): a rank still training when
another fails. argv is not read: launchers add to it (--local_rank=N)."""

import json
import os
import signal
import sys
import time

rank = os.environ.get("RANK", "single")
out = os.environ["DUMP_DIR"]
waits = os.environ.get("DUMP_WAIT_RANK") == rank
if waits:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
with open(os.path.join(out, f".rank-{rank}.tmp"), "w") as handle:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, handle)
os.replace(os.path.join(out, f".rank-{rank}.tmp"), os.path.join(out, f"rank-{rank}.json"))
if waits:
    while True:
        time.sleep(0.1)
world = int(os.environ.get("WORLD_SIZE", "1"))
deadline = time.monotonic() + 60
while time.monotonic() < deadline and \
        len([n for n in os.listdir(out) if n.endswith(".json")]) < world:
    time.sleep(0.05)
codes = dict(pair.split("=") for pair in os.environ.get("DUMP_EXIT", "").split(",") if pair)
if codes.get(rank) == "SEGV":
    os.kill(os.getpid(), signal.SIGSEGV)
sys.exit(int(codes.get(rank, "0")))
