"""forgelm-tui in front of deepspeed and accelerate launch, against the launchers themselves.

    python bench/launchers.py [--runs 5] [--nproc 2]

The same command, run by the launcher alone and behind ``forgelm-tui --no-tui``, runs
alternating: ``deepspeed --num_gpus N R`` and ``accelerate launch --multi_gpu --num_processes N
R`` (``ACCELERATE_USE_CPU=true``), where R (``bench/ranks/launcher_rank.py``, torch-free) marks
its start, then the last rank exits 7 after 1 s while the others wait for SIGTERM (their
handler marks it and exits 143). From the ranks' own marks and the launcher's exit (one
machine, one clock):

  ready      the command started -> the last rank started (the launcher's own start-up)
  signalled  the failing rank's exit -> the last other rank's SIGTERM handler ran
  exited     the failing rank's exit -> the launcher exited

Medians over --runs runs each; raw numbers in bench/launchers.json. No timing is asserted
anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = HERE / "ranks" / "launcher_rank.py"
BIN = Path(sys.executable).parent
FORGELM_TUI = os.environ.get("BENCH_FORGELM_TUI", str(BIN / "forgelm-tui"))


def commands(nproc: int) -> dict[str, list[str]]:
    deepspeed = ["deepspeed", "--num_gpus", str(nproc), str(RANK)]
    accelerate = ["accelerate", "launch", "--multi_gpu", "--num_processes", str(nproc),
                  "--mixed_precision", "no", "--dynamo_backend", "no", "--num_machines", "1",
                  str(RANK)]
    return {"deepspeed": [str(BIN / "deepspeed"), *deepspeed[1:]],
            "forgelm-tui deepspeed": [FORGELM_TUI, "--no-tui", *deepspeed],
            "accelerate launch": [str(BIN / "accelerate"), *accelerate[1:]],
            "forgelm-tui accelerate launch": [FORGELM_TUI, "--no-tui", *accelerate]}


def one(cmd: list[str], nproc: int, port: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as marks:
        env = {**os.environ, "MARKS": marks, "HF_HOME": os.path.join(marks, "hf"),
               "ACCELERATE_USE_CPU": "true"}
        flag = "--master_port" if any("deepspeed" in w for w in cmd[:3]) else "--main_process_port"
        at = cmd.index(str(RANK))
        started = time.time()
        proc = subprocess.run([*cmd[:at], flag, str(port), *cmd[at:]], cwd=marks, env=env,
                              capture_output=True, text=True, timeout=180)
        ended = time.time()
        got = {p.name: float(p.read_text()) for p in Path(marks).glob("*.mark")}
    starts = [v for k, v in got.items() if k.startswith("start-")]
    terms = [v for k, v in got.items() if k.startswith("term-")]
    failed = got.get("failed.mark")
    if len(starts) != nproc or failed is None or len(terms) != nproc - 1:
        raise RuntimeError(f"{cmd[:3]}: marks {sorted(got)}, exit {proc.returncode}: "
                           f"{proc.stdout[-500:]} {proc.stderr[-500:]}")
    return {"code": proc.returncode, "ready": (max(starts) - started) * 1000,
            "signalled": (max(terms) - failed) * 1000, "exited": (ended - failed) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    cmds = commands(args.nproc)
    raw: dict[str, list[dict[str, float]]] = {name: [] for name in cmds}
    port = 25500
    for run in range(args.runs):
        for name, cmd in cmds.items():
            port += 2
            raw[name].append(one(cmd, args.nproc, port))
            print(run, name, raw[name][-1], flush=True)
    (HERE / "launchers.json").write_text(json.dumps(raw, indent=1) + "\n")
    print("\n| launcher | runs | exit codes | ready (ms) | signalled (ms) | exited (ms) |")
    print("|---|---|---|---|---|---|")
    for name, runs in raw.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("ready", "signalled", "exited")}
        codes = sorted({int(r["code"]) for r in runs})
        print(f"| {name} | {len(runs)} | {codes} | {med['ready']:,.1f} | "
              f"{med['signalled']:,.1f} | {med['exited']:,.1f} |")


if __name__ == "__main__":
    main()
