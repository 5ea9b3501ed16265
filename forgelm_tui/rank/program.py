"""Run the rank's program as ``python [-m] program`` would: the runners' common part.

``sys.argv``, ``__main__``, ``-m`` semantics, ``sys.path[0]`` and exit codes are what the
plain interpreter gives (rank/graceful.py, rank/observed.py).
"""

from __future__ import annotations

import os
import runpy
import sys


def check_usage(argv: list[str], runner: str) -> None:
    if not argv or argv == ["-m"]:
        sys.stderr.write(f"usage: python -m {runner} [-m module | script] [args]\n")
        raise SystemExit(2)


def run(argv: list[str]) -> None:
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    if not os.path.exists(script):  # as CPython reports it, with its exit status
        sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(script)!r}"
                         ": [Errno 2] No such file or directory\n")
        raise SystemExit(2)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
