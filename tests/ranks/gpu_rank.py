"""A rank for the GPU tests: it and a child of it stand in for processes that hold a GPU.

Writes "<its pid> <child pid>" to $GPU_PIDS_DIR/rank-$RANK.pids, waits for $GPU_PIDS_DIR/go
(at most 60 s), then exits with $GPU_EXIT_<RANK> (default 0).
"""

import os
import pathlib
import subprocess
import sys
import time

where = pathlib.Path(os.environ["GPU_PIDS_DIR"])
rank = os.environ["RANK"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
tmp = where / f".rank-{rank}.tmp"
tmp.write_text(f"{os.getpid()} {child.pid}")
os.replace(tmp, where / f"rank-{rank}.pids")
deadline = time.monotonic() + 60
while not (where / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
child.kill()
child.wait()
sys.exit(int(os.environ.get(f"GPU_EXIT_{rank}", "0")))
