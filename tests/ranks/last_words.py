"""Rank program: rank 1 writes its last words at once and exits 2 with no flush between: many
stdout lines, a stderr traceback-like block and a last line with no newline, all still in the
pipes when its pidfd becomes readable. The other ranks wait for the stop's SIGTERM."""

import os
import signal
import time

if os.environ["RANK"] != "1":
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    signal.sigtimedwait([signal.SIGTERM], 60)  # nothing outlives a broken test
    os._exit(143)
time.sleep(0.05)
os.write(1, b"".join(b"line %d of the last words\n" % i for i in range(2000)))
os.write(2, b"Traceback (most recent call last):\nValueError: the end\n")
os.write(1, b"no newline at the very end")
os._exit(2)
