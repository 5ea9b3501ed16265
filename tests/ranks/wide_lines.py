"""Rank program: write LINES lines of WIDTH bytes each (newline included), then wait to be released.

argv: LINES WIDTH MARKS. Line ``i`` of rank ``r`` starts ``r{r} {i:06d} `` and is padded with
``x``. When done the rank writes MARKS/done-RANK and exits once MARKS/release exists.
"""

import os
import sys
import time
from pathlib import Path

lines, width = int(sys.argv[1]), int(sys.argv[2])
marks = Path(sys.argv[3])
rank = int(os.environ["RANK"])
out = sys.stdout.buffer
for i in range(lines):
    head = b"r%d %06d " % (rank, i)
    out.write(head + b"x" * (width - len(head) - 1) + b"\n")
out.flush()
(marks / f"done-{rank}").write_text("")
deadline = time.monotonic() + 120
while not (marks / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
