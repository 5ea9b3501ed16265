"""Rank N kills itself with signal S (a real-time one, say); the others sleep until stopped."""

import contextlib
import os
import resource
import signal
import sys
import time

victim, number = int(sys.argv[1]), int(sys.argv[2])
if int(os.environ["RANK"]) == victim:
    time.sleep(0.3)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT, SIGSEGV...: no core file
    with contextlib.suppress(OSError):  # SIGKILL, and glibc's own 32 and 33, refuse a handler
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    time.sleep(10)
    sys.exit(99)  # the signal did not end it
time.sleep(60)
