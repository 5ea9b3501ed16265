"""A rank of an elastic run's tests: records what torchrun's variables say (WORLD_SIZE
GROUP_RANK GROUP_WORLD_SIZE MASTER_PORT) and ends as the test needs.

argv: MARKS [WORLD]. Without WORLD: in ``<RESTART_COUNT>-<RANK>``; it waits to be stopped in
the first attempt and exits 0 after 0.3 s in a later one. With WORLD: in
``w<WORLD_SIZE>-<RANK>``; it exits 0 after 0.3 s once WORLD_SIZE is WORLD, else waits to be
stopped (a node joining an elastic run restarts it, not counted: the restart count stays).
"""

import os
import sys
import time
from pathlib import Path

marks = Path(sys.argv[1])
world = sys.argv[2] if len(sys.argv) > 2 else None
env = os.environ
name = f"w{env['WORLD_SIZE']}" if world else env["TORCHELASTIC_RESTART_COUNT"]
(marks / f"{name}-{env['RANK']}").write_text(" ".join(
    env[k] for k in ("WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_PORT",
                     "TORCHELASTIC_RESTART_COUNT")))
done = env["WORLD_SIZE"] == world if world else env["TORCHELASTIC_RESTART_COUNT"] != "0"
time.sleep(0.3 if done else 60)
