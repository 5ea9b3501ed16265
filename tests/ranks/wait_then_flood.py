"""Rank program: say it is ready, wait for a go file, print a lot, exit with a code.

argv: DIR LINES CODE [anything else is ignored: an option with a secret, say]
Writes DIR/ready-RANK once started, waits (at most 60 s) for DIR/go, prints LINES numbered lines
of about 100 bytes on stdout and one line on stderr, then exits with CODE.
"""

import os
import sys
import time

out, lines, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank = int(os.environ["RANK"])
with open(os.path.join(out, f"ready-{rank}.tmp"), "w") as handle:
    handle.write(str(os.getpid()))
os.replace(os.path.join(out, f"ready-{rank}.tmp"), os.path.join(out, f"ready-{rank}"))
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
    time.sleep(0.02)
pad = "x" * 70
write = sys.stdout.write
for i in range(lines):
    write(f"r{rank:03d} line {i:09d} {pad}\n")
sys.stdout.flush()
print(f"rank {rank} done", file=sys.stderr, flush=True)
sys.exit(code)
