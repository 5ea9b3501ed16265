"""Rank program of the soak's memory run (bench/soak.py): print for a fixed time, or stay silent.

argv: DIR SECONDS RATE SEED. With RATE > 0, writes the records of its soak stream
(bench/ranks/soak_stream.py: numbered lines, ``\\r`` updates, lines without a newline, binary
bytes, long lines) to stdout, RATE records a second, for SECONDS; with RATE 0 it sleeps as long.
At the end it writes DIR/wrote-RANK = "BYTES CRC32" of everything it wrote, and exits 0.
"""

import os
import sys
import time
import zlib

import soak_stream

out_dir, seconds, rate, seed = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rank = int(os.environ["RANK"])
start = time.monotonic()
end = start + seconds
size = crc = 0
if rate > 0:
    records = soak_stream.records(f"mem{seed}.r{rank}")
    due = start
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if now < due:
            time.sleep(min(due, end) - now)
            continue
        data = b""
        while due <= now:  # catch up in one write after a late wake-up
            data += next(records)
            due += 1.0 / rate
        view = memoryview(data)
        while view:
            n = os.write(1, view)
            view = view[n:]
        size += len(data)
        crc = zlib.crc32(data, crc)
else:
    time.sleep(seconds)
path = os.path.join(out_dir, f"wrote-{rank}")
with open(path + ".tmp", "w") as handle:
    handle.write(f"{size} {crc}")
os.replace(path + ".tmp", path)
