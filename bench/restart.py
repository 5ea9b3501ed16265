"""Restart latency across two loopback nodes: forgelm-tui against torchrun, same case.

    python bench/restart.py [--runs 5]

Two "nodes" (launcher processes) x 2 ranks (``bench/ranks/restart_rank.py``, torch-free),
``--max-restarts 1``: the last rank (node 1) exits 9 after 1.5 s, once; every rank of the
restart exits 0 after 1 s. forgelm-tui runs ``--nnodes 2 --node-rank i --rdzv-endpoint
127.0.0.1:P --restart-backoff 0`` (its default backoff is 1 s; torchrun has none); torchrun
``--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P`` (its agents restart the failing
node's workers, and node 0's when it sees a node waiting; --monitor-interval at torch's default).
Both must end 0. From the ranks' own marks (one machine, one clock):

  restart     the last rank of the first attempt ended -> the first rank of the next started
  ready       the failure (rank 3's exit) -> the last rank of the next attempt started
  stopped     the failure -> the last rank of the first attempt ended

Medians over --runs runs each, runs alternating; raw numbers in bench/restart.json. No timing
is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = HERE / "ranks" / "restart_rank.py"
VICTIM = 3


def free_port_pair() -> int:
    for _ in range(200):
        with socket.socket() as a:
            a.bind(("", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("", port + 1))
                except OSError:
                    continue
                return int(port)
    raise SystemExit("no free pair of ports")


def commands(tool: str, node: int, port: int, work: Path) -> list[str]:
    rank = [str(RANK), str(work / "marks"), str(VICTIM)]
    if tool == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"127.0.0.1:{port}", "--rdzv-id", work.name, "--max-restarts", "1", *rank]
    launcher = os.environ.get("BENCH_FORGELM_TUI")
    prefix = [launcher] if launcher else [sys.executable, "-m", "forgelm_tui"]
    return [*prefix, "--no-tui", "--run-dir", str(work / "run"), "--nnodes", "2",
            "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--nproc-per-node", "2", "--max-restarts", "1", "--restart-backoff", "0", *rank]


def read(marks: Path, kind: str) -> dict[tuple[int, int], float]:
    out = {}
    for path in marks.glob(f"{kind}-*"):
        _, rank, n = path.name.split("-")
        out[(int(rank), int(n))] = float(path.read_text())
    return out


def one(tool: str) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix=f"restart-{tool}-"))
    (work / "marks").mkdir()
    port = free_port_pair()
    procs = [subprocess.Popen(commands(tool, node, port, work), cwd=work,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True) for node in range(2)]
    codes = [p.wait(120) for p in procs]
    if codes != [0, 0]:
        raise SystemExit(f"{tool}: exit codes {codes} (kept: {work})")
    starts, ends = read(work / "marks", "start"), read(work / "marks", "end")
    first_end = [t for (r, n), t in ends.items() if n == 0]
    second_start = [t for (r, n), t in starts.items() if n == 1]
    if len(first_end) != 4 or len(second_start) != 4:
        raise SystemExit(f"{tool}: marks incomplete (kept: {work})")
    failure = ends[(VICTIM, 0)]
    shutil.rmtree(work, ignore_errors=True)
    return {"restart": (min(second_start) - max(first_end)) * 1000,
            "ready": (max(second_start) - failure) * 1000,
            "stopped": (max(first_end) - failure) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"forgelm-tui": [], "torchrun": []}
    for tool in results:  # untimed warm-up
        one(tool)
    for _ in range(args.runs):
        for tool in results:
            results[tool].append(one(tool))
            time.sleep(0.5)
    print(f"{'':12} {'restart ms':>12} {'ready ms':>10} {'stopped ms':>11}  (medians of "
          f"{args.runs})")
    medians = {}
    for tool, runs in results.items():
        medians[tool] = {k: round(statistics.median(r[k] for r in runs), 1)
                         for k in ("restart", "ready", "stopped")}
        m = medians[tool]
        print(f"{tool:12} {m['restart']:12.1f} {m['ready']:10.1f} {m['stopped']:11.1f}")
    (HERE / "restart.json").write_text(json.dumps(
        {"runs": results, "medians": medians, "at": time.strftime("%Y-%m-%d %H:%M:%S")},
        indent=1) + "\n")


if __name__ == "__main__":
    main()
