"""Rank program: print a line, close its own stdout (both fds 1 and sys.stdout), write to
stderr, sleep a little, exit with argv[1]."""

import os
import sys
import time

print("before closing stdout", flush=True)
sys.stdout.close()
os.close(1)
sys.stderr.write("stdout is closed; still here\n")
sys.stderr.flush()
time.sleep(0.2)
os._exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
