"""Rank program for bench/attach.py: flood.py's lines, but only once a gate opens.

argv: GATE LINES DIR. Writes DIR/waiting-RANK, then blocks in ``os.read(GATE, 1)`` (GATE is a
FIFO the bench holds open; one byte per rank opens it; no polling, no CPU while waiting), then
prints LINES lines of exactly 100 bytes in flood.py's format (``rNNN line IIIIIIIII xxx...x``)
and writes DIR/flood-RANK = "M0 M1 W0 W1": ``time.monotonic()`` (CLOCK_MONOTONIC, the same
clock as the bench's) and ``time.time()`` after the gate and after the last flush.
Exits by itself (code 3) if the gate is not opened within 120 s.
"""

import os
import select
import sys
import time

gate, lines, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank = int(os.environ["RANK"])
fd = os.open(gate, os.O_RDONLY)  # the bench holds the FIFO open O_RDWR: no blocking here
with open(os.path.join(out, f"waiting-{rank}"), "w") as handle:
    handle.write(str(os.getpid()))
if not select.select([fd], [], [], 120)[0]:
    sys.exit(3)
os.read(fd, 1)  # exactly one byte: the other rank's byte stays for it
m0, w0 = time.monotonic(), time.time()
pad = "x" * 79
write = sys.stdout.write
for i in range(lines):
    write(f"r{rank:03d} line {i:09d} {pad}\n")
sys.stdout.flush()
m1, w1 = time.monotonic(), time.time()
with open(os.path.join(out, f"flood-{rank}"), "w") as handle:
    handle.write(f"{m0} {m1} {w0} {w1}")
