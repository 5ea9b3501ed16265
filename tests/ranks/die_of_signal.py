"""Rank N kills itself with signal S (a real-time one, say); the others sleep until stopped."""

import os
import signal
import sys
import time

victim, number = int(sys.argv[1]), int(sys.argv[2])
if int(os.environ["RANK"]) == victim:
    time.sleep(0.3)
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
time.sleep(60)
