"""Rank program: write MIB mebibytes to stdout with no newline at all, then wait to be released.

argv: MIB MARKS. Every byte is ``chr(65 + RANK)``, written a mebibyte at a time. When done the
rank writes MARKS/done-RANK and exits once MARKS/release exists (the test reads the
supervisor's peak memory in between, while it is still alive).
"""

import os
import sys
import time
from pathlib import Path

mib = int(sys.argv[1])
marks = Path(sys.argv[2])
rank = int(os.environ["RANK"])
block = bytes([65 + rank]) * (1 << 20)
out = sys.stdout.buffer
for _ in range(mib):
    out.write(block)
out.flush()
(marks / f"done-{rank}").write_text("")
deadline = time.monotonic() + 120
while not (marks / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
