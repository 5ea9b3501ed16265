"""Rank program: silent and idle, but alive through heartbeats on the channel, for S seconds."""

import sys
import time

from forgelm_tui.rank import heartbeat

deadline = time.time() + float(sys.argv[1])
while time.time() < deadline:
    heartbeat()
    time.sleep(0.5)
