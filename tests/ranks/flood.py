"""Rank program: print LINES numbered lines of about 100 bytes, then exit with CODE.

argv: LINES [CODE]
"""

import os
import sys

lines = int(sys.argv[1])
code = int(sys.argv[2]) if len(sys.argv) > 2 else 0
rank = int(os.environ["RANK"])
pad = "x" * 70
write = sys.stdout.write
for i in range(lines):
    write(f"r{rank:03d} line {i:09d} {pad}\n")
sys.stdout.flush()
sys.exit(code)
