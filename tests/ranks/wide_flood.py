"""Rank program: print lines of WIDTH bytes as fast as the pipe takes them, for SECONDS.

argv: WIDTH SECONDS. A flood of long lines that lasts while a test presses keys in the TUI.
"""

import os
import sys
import time

width, seconds = int(sys.argv[1]), float(sys.argv[2])
rank = int(os.environ["RANK"])
out = sys.stdout.buffer
line = b"r%d " % rank + b"w" * (width - 4) + b"\n"
end = time.monotonic() + seconds
while time.monotonic() < end:
    out.write(line * 16)
    out.flush()
