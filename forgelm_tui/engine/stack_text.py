"""Reading a stack dump: each thread's frames, and the innermost frame of the main thread.

Two formats, both innermost frame first: faulthandler's (the rank's own handler,
``rank.stacks``) and ``py-spy dump --full-filenames``. A frame is named ``file:line function``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# faulthandler: 'Current thread 0x00007f96d583fb80 (most recent call first):'
#               '  File "/x/train.py", line 10 in spin'
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*?)\s*$')
# py-spy:       'Thread 14371 (active+gil): "MainThread"'
#               '    spin (/x/train.py:10)'
_SPY_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_SPY_FRAME = re.compile(r"^\s+(.*\S) \((.*):(\d+)\)\s*$")


@dataclass
class Thread:
    ident: int
    name: str | None = None
    frames: list[str] = field(default_factory=list)  # "file:line function", innermost first


def faulthandler_threads(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        if found := _FH_THREAD.match(line):
            threads.append(Thread(int(found[1], 16)))
        elif threads and (frame := _FH_FRAME.match(line)):
            threads[-1].frames.append(f"{frame[1]}:{frame[2]} {frame[3]}")
    return threads


def py_spy_threads(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        if found := _SPY_THREAD.match(line):
            threads.append(Thread(int(found[1], 0), found[3]))
        elif threads and (frame := _SPY_FRAME.match(line)):
            threads[-1].frames.append(f"{frame[2]}:{frame[3]} {frame[1]}")
    return threads


def main_thread(threads: Iterable[Thread], ident: int | None) -> Thread | None:
    """The thread ``ident`` names (faulthandler: the main thread's ident the rank announced;
    py-spy: the process id, the main thread's OS id), else the one named MainThread, else the
    oldest: CPython lists threads newest first, so the main thread is last."""
    listed = list(threads)
    return (next((t for t in listed if ident is not None and t.ident == ident), None)
            or next((t for t in listed if t.name == "MainThread"), None)
            or (listed[-1] if listed else None))


def innermost(threads: Iterable[Thread], ident: int | None) -> str | None:
    thread = main_thread(threads, ident)
    return thread.frames[0] if thread is not None and thread.frames else None


def short_frame(frame: str) -> str:
    """``/long/path/pkg/train.py:10 spin`` -> ``pkg/train.py:10 spin``, for narrow views."""
    where, _, function = frame.partition(" ")
    path, _, line = where.rpartition(":")
    tail = "/".join(path.split("/")[-2:]) if path else where
    return f"{tail}:{line} {function}".strip() if path else frame
