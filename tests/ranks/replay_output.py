"""Rank program: writes a captured output file again, as its program wrote it (every bar redraw
a write of its own, so the supervisor reads it in many chunks), then exits 0.

argv: FILE... (rank N replays the N-th file; to stdout when its name says ``stdout``)
"""

import os
import sys
import time

path = sys.argv[1 + int(os.environ["RANK"])]
stream = sys.stdout.buffer if "stdout" in os.path.basename(path) else sys.stderr.buffer
with open(path, "rb") as handle:
    data = handle.read()
for number, piece in enumerate(data.split(b"\r")):
    stream.write((b"\r" if number else b"") + piece)
    stream.flush()
    if number % 8 == 0:
        time.sleep(0.002)
