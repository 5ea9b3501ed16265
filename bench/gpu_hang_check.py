"""Collective evidence and hang naming on NCCL, on a real GPU machine (issue 22; it cannot run on
a CPU one). The sibling of bench/gpu_check.py.

    .venv/bin/python bench/gpu_hang_check.py [--seconds 20] [--stall-timeout 5]

1. ``healthy``: ``forgelm-tui --no-tui --standalone --nproc-per-node G --stall-timeout S
   bench/ranks/nccl_loop.py healthy SECONDS`` (G: the GPUs, at most 2; one rank a GPU, as NCCL
   wants), silent after a banner for SECONDS > S: must end 0, no stop, every rank's
   ``collectives`` counted (NCCL's sequence numbers read as gloo's are).
2. ``chatty`` (needs 2 GPUs: NCCL refuses two ranks on one device): after 3 s rank 1 stops
   taking part while a thread prints; rank 0 blocks reading its all-reduced tensor (a CUDA
   synchronisation, spinning a core): must end 2, stall, ``hang.missing_ranks == [1]``,
   ``waiting_ranks == [0]``. The op is printed, not required: a rank blocked in a CUDA
   synchronisation shows the Python line that read the tensor, not a c10d frame.
3. NCCL's flight recorder (engine/nccl_dump.py): after ``healthy`` each rank's dump pipe
   (``nccl-pipe-rank-N.pipe``, made by torch) is in the run dir; after ``chatty`` the stall's
   request made both ranks dump, and ``hang.trace_files`` names ``nccl-trace-rank-0`` and
   ``-1`` (neither on ``--dry-run``: gloo has no such pipe).

Exit 0 when every check that could run passed, 1 otherwise; each result is printed, and what
did not run (one GPU: no hang case) is said. ``--dry-run``: the same two runs on gloo and CPU
tensors, as if there were two GPUs: the check's own flow, on a machine without one.
"""

from __future__ import annotations

import argparse
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
RANK = str(ROOT / "bench" / "ranks" / "nccl_loop.py")


def gpus() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def run(mode: str, nproc: int, seconds: float, stall: float, where: Path,
        backend: str) -> dict[str, Any]:
    began = time.monotonic()
    proc = subprocess.run([FTUI, "--no-tui", "--standalone", "--nproc-per-node", str(nproc),
                           "--stall-timeout", f"{stall:g}", "--grace", "5", "--run-dir",
                           str(where), RANK, mode, f"{seconds:g}", backend],
                          capture_output=True, text=True, timeout=seconds + 240)
    envelope = json.loads((where / "envelope.json").read_text())
    print(f"{mode}: exit {proc.returncode} in {time.monotonic() - began:.1f} s; "
          f"stop {envelope['stop'] and envelope['stop']['kind']}; hang {envelope['hang']}; "
          f"collectives {[r['collectives'] for r in envelope['ranks']]}")
    for line in proc.stdout.splitlines():
        if "hang:" in line:
            print(f"  {line}")
    return {"code": proc.returncode, "envelope": envelope}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--stall-timeout", type=float, default=5.0)
    parser.add_argument("--dry-run", action="store_true",
                        help="gloo on CPU tensors, as if there were two GPUs")
    opts = parser.parse_args()
    backend = "gloo" if opts.dry_run else "nccl"
    count = 2 if opts.dry_run else gpus()
    if count == 0:
        print("no CUDA device: this check runs on a GPU machine (nothing was checked)")
        return 1
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-hang-") as tmp:
        healthy = run("healthy", min(count, 2), opts.seconds, opts.stall_timeout,
                      Path(tmp) / "healthy", backend)
        envelope = healthy["envelope"]
        if healthy["code"] != 0 or envelope["stop"] is not None:
            problems.append(f"healthy: exit {healthy['code']}, stop {envelope['stop']}")
        if not all(r["collectives"] and max(r["collectives"].values()) > 0
                   for r in envelope["ranks"]):
            problems.append("healthy: a rank's collective counts are missing on NCCL")
        pipes = sorted(p.name for p in (Path(tmp) / "healthy").glob("nccl-pipe-rank-*.pipe")
                       if p.is_fifo())
        print(f"healthy: NCCL's dump pipes in the run dir: {pipes}")
        if not opts.dry_run and len(pipes) != min(count, 2):
            problems.append(f"healthy: NCCL's dump pipes missing from the run dir ({pipes})")
        if count < 2:
            print("chatty: not run (one GPU; NCCL wants one rank a device)")
        else:
            chatty = run("chatty", 2, 600, opts.stall_timeout, Path(tmp) / "chatty", backend)
            hang = chatty["envelope"]["hang"] or {}
            if chatty["code"] != 2 or (hang.get("missing_ranks"), hang.get("waiting_ranks")) \
                    != ([1], [0]):
                problems.append(f"chatty: exit {chatty['code']}, hang {hang}")
            dumps = [f for f in hang.get("trace_files", []) if "nccl-trace-rank-" in f]
            print(f"chatty: NCCL flight-recorder dumps named: {dumps}")
            if not opts.dry_run and len(dumps) != 2:
                problems.append(f"chatty: the stall's NCCL dumps are not both named ({dumps})")
    for problem in problems:
        print(f"MISMATCH {problem}")
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
