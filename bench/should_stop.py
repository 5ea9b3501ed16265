"""Cost of forgelm_tui.rank.StopAgreement.should_stop() on 2 gloo ranks (CPU).

    python bench/should_stop.py [--calls N]

Launches bench/should_stop_rank.py under forgelm-tui and prints per-call medians (5 runs of
N calls each): every step, every 10 steps, and a bare one-int all_reduce as the floor.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "should_stop.json"
        subprocess.run([sys.executable, "-m", "forgelm_tui", "--no-tui", "--nproc-per-node", "2",
                        "--run-dir", str(Path(tmp) / "run"), str(HERE / "should_stop_rank.py"),
                        str(opts.calls), str(out)], check=True, stdout=subprocess.DEVNULL,
                       timeout=600)
        data = json.loads(out.read_text())
    print(json.dumps(data, indent=2))
    (HERE / "should_stop.json").write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
