"""The deterministic byte streams of the soak ranks (bench/ranks/soak_rank.py), shared with the
checker in bench/soak.py: the same key always gives the same bytes, so a rank log can be compared
byte for byte with what the rank wrote.

A stream is an endless run of records, chosen by a ``random.Random(key)``:

- numbered lines ``TAG NNNNNNNN <hex padding> crc=XXXXXXXX`` (CRC-32 of what precedes it), most;
- progress-bar updates ending in ``\\r`` (no newline);
- fragments without a newline, glued to the next record;
- binary bytes (NUL, ESC, invalid UTF-8, stray newlines);
- long lines (8-256 KiB) and, rarely, very long ones (256 KiB-1 MiB), with their newline.

A ``.dense`` key (a flooding rank's stdout) is mostly short lines: many lines, fast.

``prefix(key, n)`` is the first ``n`` bytes; ``records(key)`` yields them one by one.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator

MIXED = (0.80, 0.87, 0.92, 0.9945, 0.9995)  # line, \r, fragment, binary, long, very long
DENSE = (0.97, 0.98, 0.99, 0.9985, 0.99995)  # a flood of short lines (key ending in ".dense")


def records(key: str) -> Iterator[bytes]:
    rng = random.Random(key)
    tag = key.encode()
    line, bar, fragment, binary, long = DENSE if key.endswith(".dense") else MIXED
    i = 0
    while True:
        kind = rng.random()
        head = b"%s %08d " % (tag, i)
        if kind < line:
            body = head + rng.randbytes(rng.randrange(0, 60)).hex().encode()
            yield body + b" crc=%08x\n" % zlib.crc32(body)
        elif kind < bar:
            yield head + b"progress %3d%%\r" % rng.randrange(0, 101)
        elif kind < fragment:
            yield head + b"partial-"
        elif kind < binary:
            yield rng.randbytes(rng.randrange(1, 2048))
        elif kind < long:
            yield head + bytes([rng.randrange(97, 123)]) * rng.randrange(8 << 10, 256 << 10) + b"\n"
        else:
            yield head + bytes([rng.randrange(65, 91)]) * rng.randrange(256 << 10, 1 << 20) + b"\n"
        i += 1


def prefix(key: str, size: int) -> bytes:
    """The first ``size`` bytes of the stream ``key``."""
    out = bytearray()
    if size <= 0:
        return b""
    for record in records(key):
        out += record
        if len(out) >= size:
            break
    return bytes(out[:size])


def stream_key(seed: int, run: int, rank: int, stream: str, dense: bool = False) -> str:
    return f"s{seed}.{run}.r{rank}.{stream}" + (".dense" if dense else "")
