"""The signals the CLI holds from its console script's first line until the run's handlers
take them (console.py, engine/signal_inbox.py), and which commands hold them."""

from __future__ import annotations

import signal

EARLY: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                          signal.SIGUSR1, signal.SIGUSR2)
VIEWS = ("attach", "ls", "serve")  # they start nothing to stop: ordinary signals


def holds_signals(argv: list[str]) -> bool:
    return argv[1:2] not in ([view] for view in VIEWS)
