"""Rank program: wait until GATE exists, print LINES numbered lines of about 100 bytes, then
exit 0, or with --then-wait sleep until signalled (the run goes on after the flood).

argv: GATE LINES [--then-wait]
"""

import os
import sys
import time

gate, lines = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
print(f"rank {rank} at the gate", flush=True)
while not os.path.exists(gate):
    time.sleep(0.01)
pad = "x" * 70
write = sys.stdout.write
for i in range(lines):
    write(f"r{rank:03d} line {i:09d} {pad}\n")
sys.stdout.flush()
if "--then-wait" in sys.argv:
    while True:
        time.sleep(0.05)
