"""Every rank dies of a signal of its own, all at once: rank R of signal NUMBERS[R].

argv: MARKS NUMBERS (comma-separated). Each rank ignores SIGTERM (the supervisor's stop after
the first death must not be what ends the others), writes its pid to MARKS/ready-RANK, waits for
MARKS/go, then sends itself its signal; exits 99 if that did not end it.
"""

import contextlib
import os
import resource
import signal
import sys
import time

marks, numbers = sys.argv[1], [int(n) for n in sys.argv[2].split(",")]
rank = int(os.environ["RANK"])
number = numbers[rank]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT, SIGSEGV...: no core file
with contextlib.suppress(OSError, ValueError):  # SIGKILL, glibc's 32 and 33 refuse a handler
    signal.signal(number, signal.SIG_DFL)
ready = os.path.join(marks, f"ready-{rank}")
with open(ready + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(ready + ".tmp", ready)
go = os.path.join(marks, "go")
while not os.path.exists(go):
    time.sleep(0.01)
os.kill(os.getpid(), number)
time.sleep(10)
sys.exit(99)  # the signal did not end it
