"""Prints the capacity of the pipes the rank's stdout and stderr write to."""

import fcntl
import sys

sizes = [fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) for fd in (1, 2)]
print(f"pipe sizes {sizes[0]} {sizes[1]}", flush=True)
sys.exit(0)
