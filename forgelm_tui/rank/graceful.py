"""Run a Python program so that SIGTERM becomes an exception raised in its main thread.

    python -m forgelm_tui.rank.graceful -m forgelm.cli --config job.yaml
    python -m forgelm_tui.rank.graceful train.py --lr 1e-4

A program with no SIGTERM handler (ForgeLM 0.11.1) dies at once on SIGTERM: no ``except``,
no ``finally``, no atexit, no audit event, no result. Under this runner the first SIGTERM raises
:class:`GracefulStop` (an ``Exception``, so the program's own ``except Exception`` cleanup runs:
ForgeLM writes ``pipeline.failed`` and its JSON result, then exits 2). Every later SIGTERM is
the same request, whenever it comes: a scheduler signals every process of the step (slurmstepd
sends SIGTERM, SIGCONT, SIGTERM at a time limit, and with preemption's GraceTime another SIGTERM
that much later), the supervisor's own stop follows (seconds later on a loaded node), and the
runner cannot tell their senders apart; none may end a cleanup under way. The supervisor's
SIGKILL at the grace deadline is what ends a cleanup that overruns. Once the program has ended,
SIGTERM is ignored: the interpreter's teardown keeps the exit code the program chose.

Nothing else changes: ``sys.argv``, ``__main__``, ``-m`` semantics, ``sys.path[0]`` and exit
codes are what ``python [-m] program`` gives. If the exception is not caught, the process dies
of SIGTERM exactly as it would have without the runner.

Ranks of one job receive a stop at different moments (another node's scheduler signal comes tens
of ms later), and a rank that left its training loop never enters the next collective: a gloo
peer already waiting in it would wait until this rank's process ends, its cleanup included, and
the grace's SIGKILL takes it first. So on the first SIGTERM a gloo rank leaves its process
groups (``destroy_process_group``, and it shuts down the connections those groups opened, which
a DDP model would keep open: ``rank.leave``): a peer waiting on it fails at once ("Connection
closed by peer"), its own ``except`` cleanup runs, and the SIGTERM that reaches it there is not
raised a second time into that cleanup: while the program is handling an exception, the stop
waits until it is not (re-checked every 0.1 s) or the program ends. Cleanup code under the
runner cannot use collectives (the peers stop at different points; it never could safely). NCCL
groups are left alone: their collectives do not hold the Python thread, and destroying a
communicator with work in flight can itself hang.

Under forgelm-tui the runner also gives every HF ``Trainer`` the program builds a progress
callback (``trainer_hook``): steps and heartbeats on the channel, so ForgeLM's evaluation and
saves are not taken for a stall and every rank shows its real training step; it installs
the stacks handler (``rank.stacks``), so the supervisor can show where the program is stuck;
and with ``--collective-trace on`` it sends the program's collective counts (``rank.collectives``,
as ``rank.observed`` does for ranks not run graceful).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

from forgelm_tui.channel import MessageKind
from forgelm_tui.rank import collectives, leave, program, stacks, trainer_hook
from forgelm_tui.rank.channel import default_channel


class GracefulStop(Exception):
    """Raised in the main thread on the first SIGTERM."""


RECHECK_S = 0.1  # how often a stop deferred by an exception being handled is tried again


class _Stop:
    """The runner's one stop request: whether it came, whether it was raised, what is due."""

    requested = False
    raised = False
    recheck = False  # the next SIGTERM is the runner's own re-delivery
    done = False  # the program has ended: nothing is raised any more


_stop = _Stop()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _stop.requested:  # the same request: a burst, a scheduler's later copy, the supervisor's
        if _stop.recheck:  # ... or the runner's own re-delivery of a deferred stop
            _stop.recheck = False
            _raise_unless_cleaning_up()
        return
    _stop.requested = True
    leave.leave()
    default_channel().send(MessageKind.STOP_REQUESTED, signal="SIGTERM", via="graceful")
    _raise_unless_cleaning_up()


def _raise_unless_cleaning_up() -> None:
    """Raise the stop, unless the program is handling an exception (a failed collective's, its
    cleanup under way): then try again shortly, and never raise into that cleanup."""
    if _stop.raised or _stop.done:
        return
    if sys.exc_info()[1] is not None:
        timer = threading.Timer(RECHECK_S, _redeliver)
        timer.daemon = True
        timer.start()
        return
    _stop.raised = True
    raise GracefulStop("stopped by SIGTERM")


def _redeliver() -> None:
    if _stop.done or _stop.raised or signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        return
    _stop.recheck = True
    os.kill(os.getpid(), signal.SIGTERM)


def _die_of_sigterm() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()


def main(argv: list[str]) -> None:
    program.check_usage(argv, "forgelm_tui.rank.graceful")
    signal.signal(signal.SIGTERM, _on_sigterm)
    stacks.install(default_channel().send)  # where it is stuck, on the supervisor's request
    trainer_hook.install()
    leave.install()  # which sockets gloo groups open, to close them when the rank leaves
    collectives.install(default_channel().send)  # progress from its collectives
    try:
        program.run(argv)
    except GracefulStop:
        _stop.done = True
        _die_of_sigterm()
    finally:
        _stop.done = True
        # The program has ended; its exit code is final. The interpreter puts SIGTERM's default
        # action back during its teardown (a ForgeLM rank's lasts ~1.5 s): a stop's SIGTERM that
        # came then turned "exited 2" into "killed by SIGTERM". Ignored, it changes nothing.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    main(sys.argv[1:])
