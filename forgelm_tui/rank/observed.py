"""Run a Python rank unchanged, with its collective counts sent to the supervisor.

    python -m forgelm_tui.rank.observed train.py --lr 1e-4
    python -m forgelm_tui.rank.observed -m package.module

What forgelm-tui puts in front of a Python rank that is not run graceful (``--graceful`` has
the same watcher): only a background thread that reads torch.distributed's collective counts
once the program initialised it (rank/collectives.py). Signals, exit codes, ``sys.argv``,
``__main__`` and ``sys.path[0]`` are what ``python [-m] program`` gives. ``--collective-trace
off`` runs the program without it.
"""

from __future__ import annotations

import sys

from forgelm_tui.rank import collectives, program


def main(argv: list[str]) -> None:
    program.check_usage(argv, "forgelm_tui.rank.observed")
    collectives.install()  # the channel is imported once torch.distributed is
    program.run(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
