"""Run a Python program so that SIGTERM becomes an exception raised in its main thread.

    python -m forgelm_tui.rank.graceful -m forgelm.cli --config job.yaml
    python -m forgelm_tui.rank.graceful train.py --lr 1e-4

A program with no SIGTERM handler (ForgeLM 0.11.1) dies at once on SIGTERM: no ``except``,
no ``finally``, no atexit, no audit event, no result. Under this runner the first SIGTERM raises
:class:`GracefulStop` (an ``Exception``, so the program's own ``except Exception`` cleanup runs:
ForgeLM writes ``pipeline.failed`` and its JSON result, then exits 2). A second SIGTERM within
1 s of the first is the same request (a scheduler signals every process of the step, and
slurmstepd sends SIGTERM, SIGCONT, SIGTERM at a time limit; the supervisor's own stop follows);
a later one, or the supervisor's SIGKILL at the grace deadline, ends it the ordinary way.

Nothing else changes: ``sys.argv``, ``__main__``, ``-m`` semantics, ``sys.path[0]`` and exit
codes are what ``python [-m] program`` gives. If the exception is not caught, the process dies
of SIGTERM exactly as it would have without the runner.

Under forgelm-tui the runner also gives every HF ``Trainer`` the program builds a progress
callback (``trainer_hook``): steps and heartbeats on the channel, so ForgeLM's evaluation and
saves are not taken for a stall and every rank shows its real training step; and it installs
the stacks handler (``rank.stacks``), so the supervisor can show where the program is stuck.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from types import FrameType

from forgelm_tui.channel import MessageKind
from forgelm_tui.rank import stacks, trainer_hook
from forgelm_tui.rank.channel import default_channel


class GracefulStop(Exception):
    """Raised in the main thread on the first SIGTERM."""


SAME_REQUEST_S = 1.0  # a SIGTERM this soon after the first is the same request (a burst)
_first_at: list[float] = []


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _first_at:  # a second SIGTERM: the same request in a burst, else the ordinary end
        if time.monotonic() - _first_at[0] <= SAME_REQUEST_S:
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _first_at.append(time.monotonic())
    default_channel().send(MessageKind.STOP_REQUESTED, signal="SIGTERM", via="graceful")
    raise GracefulStop("stopped by SIGTERM")


def _die_of_sigterm() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()


def main(argv: list[str]) -> None:
    if not argv or argv == ["-m"]:
        sys.stderr.write("usage: python -m forgelm_tui.rank.graceful [-m module | script] "
                         "[args]\n")
        raise SystemExit(2)
    signal.signal(signal.SIGTERM, _on_sigterm)
    stacks.install(default_channel().send)  # where it is stuck, on the supervisor's request
    trainer_hook.install()
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            if not os.path.exists(script):  # as CPython reports it, with its exit status
                sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(script)!r}"
                                 ": [Errno 2] No such file or directory\n")
                raise SystemExit(2)
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except GracefulStop:
        _die_of_sigterm()


if __name__ == "__main__":
    main(sys.argv[1:])
