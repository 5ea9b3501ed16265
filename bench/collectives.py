"""What the collective trace costs a rank (issue 22, docs/progress.md "Collectives").

Two gloo ranks under torchrun all-reduce a small (1 float) and a large (1M floats) tensor; each
configuration alternates in one process, several reps, medians:

- off: the program as is;
- trace: the program under ``python -m forgelm_tui.rank.observed`` with FORGELM_TUI_COLLECTIVES=1
  (the watcher thread reads the counts every second; no supervisor channel here, so its sends
  are no-ops: the reads are what is measured).

Also: the watcher's read itself (every group's sequence number) timed in-process, and the
flight recorder (TORCH_FR_BUFFER_SIZE=2000, the first design) for comparison.

    python bench/collectives.py [--reps 5] [--json bench/collectives.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = HERE / "ranks" / "collective_cost.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
CASES = ((1, 4000), (1 << 20, 200))


def one(size: int, count: int, mode: str, port: int) -> dict[str, float]:
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000" if mode == "recorder" else "0",
           "OMP_NUM_THREADS": "1"}
    env.pop("FORGELM_TUI_CHANNEL", None)
    traced = mode == "trace"
    program = ["-m", "forgelm_tui.rank.observed", str(RANK)] if traced else [str(RANK)]
    if traced:
        env["FORGELM_TUI_COLLECTIVES"] = "1"
    out = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2",
                          f"--master-port={port}", *program, str(size), str(count)],
                         env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def read_cost(reps: int = 2000) -> float:
    """Microseconds of one watcher read, in a 1-rank gloo group with a second group."""
    code = (
        "import os,time,torch,torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1',MASTER_PORT='29611',RANK='0',WORLD_SIZE='1')\n"
        "dist.init_process_group('gloo');dist.new_group([0])\n"
        "t=torch.ones(1)\n"
        "[dist.all_reduce(t) for _ in range(2500)]\n"
        "from forgelm_tui.rank.collectives import read_counts\n"
        f"s=time.perf_counter();[read_counts() for _ in range({reps})]\n"
        f"print((time.perf_counter()-s)/{reps}*1e6, read_counts())\n")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    return round(float(out[0]), 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=HERE / "collectives.json")
    opts = parser.parse_args()
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    port = 29620
    for size, count in CASES:
        runs: dict[str, list[dict[str, float]]] = {"off": [], "trace": [], "recorder": []}
        for _ in range(opts.reps):
            for name in runs:  # alternating: drift hits all alike
                port += 1
                runs[name].append(one(size, count, name, port))
        results[str(size)] = runs
    table = ["| tensor | off: µs per all-reduce | trace | ratio | recorder | ratio | "
             "off: rank RSS MiB | trace |", "|---|---|---|---|---|---|---|---|"]
    summary = {}
    for size, runs in results.items():
        off = statistics.median(r["per_op_us"] for r in runs["off"])
        on = statistics.median(r["per_op_us"] for r in runs["trace"])
        fr = statistics.median(r["per_op_us"] for r in runs["recorder"])
        rss_off = statistics.median(r["rss_mib"] for r in runs["off"])
        rss_on = statistics.median(r["rss_mib"] for r in runs["trace"])
        summary[size] = {"off_us": off, "trace_us": on, "ratio": round(on / off, 3),
                         "recorder_us": fr, "recorder_ratio": round(fr / off, 3),
                         "rss_off_mib": rss_off, "rss_trace_mib": rss_on}
        table.append(f"| {int(size):,} floats | {off:.1f} | {on:.1f} | {on / off:.3f} | "
                     f"{fr:.1f} | {fr / off:.3f} | {rss_off:.1f} | {rss_on:.1f} |")
    read_us = read_cost()
    print("\n".join(table))
    print(f"\nwatcher read (every group's sequence number, 2 groups): {read_us} µs")
    opts.json.write_text(json.dumps({"reps": opts.reps, "summary": summary, "read_us": read_us,
                                     "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
