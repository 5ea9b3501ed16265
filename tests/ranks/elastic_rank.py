"""A rank of an elastic run's tests: records what torchrun's variables say in each attempt
(``<RESTART_COUNT>-<RANK>``: WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE MASTER_PORT), then waits to
be stopped in the first attempt and exits 0 after 0.3 s in a later one.

argv: MARKS
"""

import os
import sys
import time
from pathlib import Path

marks = Path(sys.argv[1])
env = os.environ
count = env["TORCHELASTIC_RESTART_COUNT"]
(marks / f"{count}-{env['RANK']}").write_text(" ".join(
    env[k] for k in ("WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_PORT")))
time.sleep(60 if count == "0" else 0.3)
