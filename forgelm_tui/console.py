"""The console script (``forgelm-tui``) and ``python -m forgelm_tui``: the first thing either
does is block the usual signals, before the CLI's imports (~150 ms, seconds on a loaded node).

``sbatch --signal=USR1@N`` may come up to a minute early, at the step's very start: a SIGUSR1
that reached the supervisor while it was still importing took its default action and ended the
job (seen on the real SLURM test cluster). Blocked here, it waits for the run's handlers
(engine/signal_inbox.py). What is left unprotected is the interpreter's own start (~35 ms).
Views (``attach``, ``ls``, ``serve``) keep the ordinary signals: they start nothing to stop.
"""

from __future__ import annotations

import signal
import sys

from forgelm_tui.early_signals import EARLY, holds_signals


def entry() -> None:
    if holds_signals(sys.argv):
        signal.pthread_sigmask(signal.SIG_BLOCK, EARLY)
    from forgelm_tui.cli import entry as run

    run()
