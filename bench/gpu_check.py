"""Our GPU figures against nvidia-smi's, on a real GPU machine (it cannot run on a CPU one).

    .venv/bin/python bench/gpu_check.py [--ranks N|gpu] [--gib 2] [--seconds 30]

1. Starts ``forgelm-tui --no-tui --nproc-per-node N bench/ranks/gpu_burn.py`` (each rank holds
   GIB GiB on cuda:LOCAL_RANK and runs matmuls), with ``--envelope``.
2. Once every rank holds its memory, once a second for a while: our sampler
   (``engine.gpu.GpuSampler``, NVML through nvidia-ml-py, in this process) and, at the same
   moment, ``nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory`` and ``nvidia-smi
   --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw``.
   Compared: each rank's devices (ours from its process tree, theirs by pid), its memory
   (within 1% or 2 MiB: nvidia-smi rounds to MiB), each device's memory used and total (1%),
   temperature (2 C), power (10%), utilisation (20 points: the two read different windows).
3. After the run: the envelope's ``ranks[].gpu.devices`` is the UUID nvidia-smi showed for the
   rank, and ``peak_memory_bytes`` the most nvidia-smi saw for it (within 2%).
Also printed: the CPU time of one of our sample passes on the real driver (issue 14's cost
goal: <= 2% of a core at 8 ranks, that is <= 20 ms a pass at 1 Hz).

Exit 0 when everything matched, 1 otherwise; every mismatch is printed. Needs torch with CUDA
and nvidia-smi on PATH. CUDA_VISIBLE_DEVICES is honoured (``--ranks gpu`` counts as torchrun).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FTUI = os.environ.get("BENCH_FORGELM_TUI", str(Path(sys.executable).parent / "forgelm-tui"))
MIB = 1 << 20
problems: list[str] = []


def smi(query: str, fields: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-{query}={fields}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return [[c.strip() for c in row] for row in csv.reader(out.splitlines()) if row]


def number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def close(what: str, ours: float | None, theirs: float | None, rel: float, slack: float) -> None:
    if ours is None or theirs is None:
        if (ours is None) != (theirs is None):
            problems.append(f"{what}: ours {ours}, nvidia-smi {theirs}")
        return
    if abs(ours - theirs) > max(rel * abs(theirs), slack):
        problems.append(f"{what}: ours {ours:g}, nvidia-smi {theirs:g}")


def compare_once(sampler: Any, ranks: dict[int, int]) -> dict[int, float]:
    """One moment, ours against theirs; returns nvidia-smi's memory per rank (bytes)."""
    ours = sampler.sample(ranks)
    apps = smi("compute-apps", "pid,gpu_uuid,used_memory")
    gpus = {row[1]: row for row in smi(
        "gpu", "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw")}
    theirs: dict[int, float] = {}
    for held in ours.ranks:
        pid = next(p for p, r in ranks.items() if r == held.rank)
        mine = [row for row in apps if int(row[0]) == pid]
        if sorted(d.uuid for d in held.devices) != sorted(row[1] for row in mine):
            problems.append(f"rank {held.rank}: devices ours "
                            f"{[d.uuid for d in held.devices]}, nvidia-smi {[r[1] for r in mine]}")
        used = sum(number(row[2]) or 0 for row in mine) * MIB
        theirs[held.rank] = used
        close(f"rank {held.rank} memory", held.memory_bytes, used, 0.01, 2 * MIB)
    for device in ours.devices:
        row = gpus.get(device.uuid)
        if row is None:
            problems.append(f"gpu{device.index} {device.uuid}: not in nvidia-smi")
            continue
        name = f"gpu{device.index}"
        close(f"{name} memory used", device.memory_used, (number(row[3]) or 0) * MIB, 0.01, 4 * MIB)
        close(f"{name} memory total", device.memory_total, (number(row[4]) or 0) * MIB, 0.01,
              4 * MIB)
        close(f"{name} temperature", device.temperature, number(row[5]), 0.0, 2)
        close(f"{name} power", device.power_watts, number(row[6]), 0.10, 5)
        close(f"{name} utilisation", device.utilization, number(row[2]), 0.0, 20)
    return theirs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="gpu")
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    from forgelm_tui.engine.gpu import GpuSampler, visible_gpu_count

    sampler = GpuSampler.open(os.environ)
    if sampler is None:
        print("no NVML here (no driver, no library or no GPU): run this on a GPU machine")
        return 1
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        cmd = [FTUI, "--no-tui", "--nproc-per-node", args.ranks, "--run-dir", str(work / "run"),
               str(ROOT / "bench" / "ranks" / "gpu_burn.py"), str(args.gib),
               str(args.seconds), str(work)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        count = int(args.ranks) if args.ranks.isdigit() else visible_gpu_count(os.environ)
        deadline = time.monotonic() + 120
        while (time.monotonic() < deadline and proc.poll() is None
               and len(list(work.glob("ready-*"))) < count):
            time.sleep(0.2)
        ranks = {int(p.read_text()): int(p.name.split("-")[1]) for p in work.glob("ready-*")}
        peaks: dict[int, float] = {}
        passes = 0
        while proc.poll() is None and passes < max(5, int(args.seconds / 2)):
            for rank, used in compare_once(sampler, ranks).items():
                peaks[rank] = max(peaks.get(rank, 0.0), used)
            passes += 1
            time.sleep(1.0)
        start = time.process_time()
        for _ in range(20):
            sampler.sample(ranks)
        per_pass = (time.process_time() - start) / 20
        print(f"{passes} comparisons; one of our sample passes ({len(ranks)} ranks): "
              f"{per_pass * 1e3:.2f} ms CPU = {per_pass * 100:.2f}% of a core at 1 Hz")
        code = proc.wait(args.seconds + 120)
        envelope = json.loads((work / "run" / "envelope.json").read_text())
    for rank in envelope["ranks"]:
        gpu = rank.get("gpu") or {}
        close(f"rank {rank['rank']} envelope peak", gpu.get("peak_memory_bytes"),
              peaks.get(rank["rank"]), 0.02, 4 * MIB)
        if not gpu.get("devices"):
            problems.append(f"rank {rank['rank']}: no device in the envelope")
    print(f"forgelm-tui exited {code}")
    for problem in problems:
        print("MISMATCH", problem)
    print("PASS" if not problems and code == 0 else "FAIL")
    return 0 if not problems and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
