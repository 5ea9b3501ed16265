"""Rank 0 exits with CODE; every other rank waits until rank 0 is gone (reaped by the
supervisor), then aborts (SIGABRT): a teardown crash after rank 0's outcome exit.

argv: CODE MARKS_DIR. Rank 0 prints a ForgeLM-style JSON result first.
"""

import json
import os
import sys
import time
from pathlib import Path

code, marks = int(sys.argv[1]), Path(sys.argv[2])
rank = int(os.environ["RANK"])
if rank == 0:
    (marks / "rank0.pid.tmp").write_text(str(os.getpid()))
    os.replace(marks / "rank0.pid.tmp", marks / "rank0.pid")  # whole, or not there
    print(json.dumps({"success": code == 0, "awaiting_approval": code == 4}), flush=True)
    sys.exit(code)
deadline = time.monotonic() + 30
while not (marks / "rank0.pid").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
pid = (marks / "rank0.pid").read_text()
while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
    time.sleep(0.01)  # gone from /proc: the supervisor has reaped it
print(f"rank {rank}: rank 0 is gone; aborting in teardown", file=sys.stderr, flush=True)
os.abort()
