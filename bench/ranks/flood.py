"""Rank program: print LINES numbered lines of exactly 100 bytes each (99 + newline), exit 0.

argv: LINES. Line format: ``rNNN line IIIIIIIII xxx...x`` so a counter can tell which rank
and which line it is and whether it arrived whole.
"""

import os
import sys

lines = int(sys.argv[1])
rank = int(os.environ["RANK"])
pad = "x" * 79
write = sys.stdout.write
for i in range(lines):
    write(f"r{rank:03d} line {i:09d} {pad}\n")
sys.stdout.flush()
