"""Does the demo race at teardown? N runs of the approval demo beside two CPU burners.

    python bench/demo_race.py [--runs 200] [--burners 2] [--timeout 120] [--keep-failures DIR]

Each run is ``forgelm-tui --no-tui demo --steps 3 --step-time 0 --exit-code 4`` (issue 12: it
ended 2 when rank 1 aborted in its gloo teardown as rank 0 left). Two processes spin a core each
the whole time, so the ranks' ending is as unevenly scheduled as on a loaded CI machine. Prints
one line per run that did not end 4 (and keeps its run dir with ``--keep-failures``), then the
count of each exit code. Exit status: 0 when every run ended 4.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COMMAND = ["demo", "--steps", "3", "--step-time", "0", "--exit-code", "4"]
EXPECTED = 4


def burn(stop: Any) -> None:
    """Spin a core until told to stop (checked every million iterations)."""
    count = 0
    while not stop.is_set():
        for _ in range(1_000_000):
            count += 1


def launcher() -> list[str]:
    here = Path(sys.executable).parent / "forgelm-tui"
    return [str(here)] if here.exists() else [sys.executable, "-m", "forgelm_tui"]


def one_run(run_dir: Path, timeout: float) -> tuple[int, str]:
    """The run's exit code (or -1 on a timeout) and, when it is not 4, why."""
    env = {**os.environ, "CI": "true", "OMP_NUM_THREADS": "1"}
    argv = [*launcher(), "--no-tui", "--run-dir", str(run_dir), *COMMAND]
    try:
        done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    if done.returncode == EXPECTED:
        return done.returncode, ""
    why = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    try:
        envelope = json.loads((run_dir / "envelope.json").read_text())
        why = [envelope["decided_by"]["explanation"]]
    except (OSError, ValueError, KeyError):
        pass
    return done.returncode, why[0]


def _counts(codes: collections.Counter[int]) -> str:
    return ", ".join(f"exit {code}: {n}" for code, n in sorted(codes.items()))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--keep-failures", type=Path, default=None)
    opts = parser.parse_args()
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(stop,), daemon=True)
               for _ in range(opts.burners)]
    for proc in burners:
        proc.start()
    codes: collections.Counter[int] = collections.Counter()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="demo-race-") as tmp:
            for index in range(opts.runs):
                run_dir = Path(tmp) / f"run-{index}"
                code, why = one_run(run_dir, opts.timeout)
                codes[code] += 1
                if code != EXPECTED:
                    print(f"run {index}: exit {code}: {why}", flush=True)
                    if opts.keep_failures is not None:
                        shutil.copytree(run_dir, opts.keep_failures / f"run-{index}",
                                        dirs_exist_ok=True)
                shutil.rmtree(run_dir, ignore_errors=True)
                if (index + 1) % 10 == 0:  # a partial count survives an interrupted bench
                    print(f"after {index + 1} runs ({time.monotonic() - started:.0f} s): "
                          f"{_counts(codes)}", flush=True)
    finally:
        stop.set()
        for proc in burners:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
    wall = time.monotonic() - started
    print(f"{opts.runs} runs with {opts.burners} CPU burners in {wall:.0f} s: {_counts(codes)}")
    return 0 if codes[EXPECTED] == opts.runs else 1


if __name__ == "__main__":
    sys.exit(main())
