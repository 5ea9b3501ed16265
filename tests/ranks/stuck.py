"""Rank program: stuck somewhere known, with or without the rank helpers' stacks handler.

argv: MARKS MODE_OF_RANK_0 [MODE_OF_RANK_1 ...]; each rank takes its own mode, then waits
forever in ``wait_here`` (or ``beating``), where it first writes MARKS/ready-RANK (its pid):
- ``helpers``: reports one step through ``forgelm_tui.rank`` (which installs and announces the
  stacks handler), then waits: a stall;
- ``plain``: imports nothing of forgelm-tui (no handler: the reserved signal would kill it);
- ``ignore``: like ``helpers``, then ignores the reserved signal (its handler never writes);
- ``beat``: like ``helpers``, then a heartbeat every 0.2 s from ``beating``: never a stall.
"""

import os
import signal
import sys
import time
from pathlib import Path

marks = Path(sys.argv[1])
rank = int(os.environ["RANK"])
mode = sys.argv[2 + rank]


def ready() -> None:
    (marks / f"ready-{rank}").write_text(str(os.getpid()))


def wait_here() -> None:
    ready()
    while True:
        time.sleep(3600)


def beating() -> None:
    from forgelm_tui.rank import heartbeat

    ready()
    while True:
        heartbeat()
        time.sleep(0.2)


if mode != "plain":
    from forgelm_tui.rank import report_progress

    report_progress(1, 10)
if mode == "ignore":
    signal.signal(int(os.environ["FORGELM_TUI_STACKS_SIGNAL"]), signal.SIG_IGN)
if mode == "beat":
    beating()
wait_here()
