"""What the GPU sampler costs (issue 14: at most 2% of a core at 8 ranks), with the fake NVML.

    .venv/bin/python bench/gpu_cost.py [--reps 5] [--window 20] [--ranks 8] [--json PATH]

Two measurements, both on the fake NVML of tests/fake_nvml (this machine has no GPU):

run     forgelm-tui --no-tui with RANKS sleeping ranks (bench/ranks/sleeper.py), the fake first on
        its PYTHONPATH, in two modes, alternating: ``gpu`` (the fake has RANKS devices, rank k's
        process on device k, written as soon as the ranks report their pids) and ``off`` (the
        fake's nvmlInit fails with LibraryNotFound: a machine without NVML). Measured: the
        supervisor's own CPU (utime+stime of /proc/PID/stat) over WINDOW seconds from 3 s after
        every rank is ready, in % of one core. The difference of the medians is the sampler's
        cost, fake included; /proc's clock ticks are 10 ms, so over 20 s a difference under
        0.1% of a core is noise.
pass    in-process: one ``GpuSampler.sample()`` pass (RANKS devices, RANKS ranks, parents
        known) timed over many passes, CPU time per pass; at the sampler's 1 Hz that is the
        share of a core. The fake's own work (a stat of its state file per call) is included;
        real NVML calls are ioctls to the driver and cost more: bench/gpu_check.py on a GPU
        machine prints the per-pass time of the real thing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fake_nvml.state import FAKE_DIR, GIB, device, fake_env, process, write_state  # noqa: E402

FTUI = os.environ.get("BENCH_FORGELM_TUI", str(Path(sys.executable).parent / "forgelm-tui"))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def one_run(mode: str, ranks: int, window: float, work: Path) -> float:
    """The supervisor's CPU over the window, in % of one core."""
    ready, state = work / f"ready-{mode}", work / f"nvml-{mode}.json"
    ready.mkdir()
    devices = [device(i) for i in range(ranks)]
    if mode == "off":
        write_state(state, [], init_error="LibraryNotFound")
    else:
        write_state(state, devices)
    env = {**fake_env(state), "CI": "true", "OMP_NUM_THREADS": "1"}
    cmd = [FTUI, "--no-tui", "--nproc-per-node", str(ranks), "--run-dir", str(work / mode),
           str(ROOT / "bench" / "ranks" / "sleeper.py"), str(ready), str(window + 30)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        files = [ready / f"ready-{r}" for r in range(ranks)]
        wait_for("the ranks", lambda: all(f.exists() for f in files), 60)
        pids = [int(f.read_text().split()[0]) for f in files]
        if mode == "gpu":
            write_state(state, devices, [process(pid, r, (r + 1) * GIB)
                                         for r, pid in enumerate(pids)])
        time.sleep(3.0)  # let start-up work settle (a measurement window, not a wait)
        before, start = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(window)
        used, wall = cpu_seconds(proc.pid) - before, time.monotonic() - start
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    envelope = json.loads((work / mode / "envelope.json").read_text())
    sampled = [r["gpu"] is not None for r in envelope["ranks"]]
    if sampled != [mode == "gpu"] * ranks:  # the mode did what it says
        raise SystemExit(f"{mode} run: GPU samples per rank {sampled}")
    return 100.0 * used / wall


def pass_cost(ranks: int, passes: int = 2000) -> float:
    """CPU microseconds of one GpuSampler pass on the fake, in-process."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_DIR / "pynvml.py")
    assert spec and spec.loader
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    sys.modules["pynvml"] = fake
    from forgelm_tui.engine.gpu import GpuSampler, PidOwners

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "nvml.json"
        pids = {10_000 + r: r for r in range(ranks)}
        write_state(state, [device(i) for i in range(ranks)],
                    [process(pid, r, GIB) for pid, r in pids.items()])
        os.environ["FAKE_NVML_STATE"] = str(state)
        sampler = GpuSampler.open({}, PidOwners(lambda pid: 1))
        assert sampler is not None
        sampler.sample(pids)
        start = time.process_time()
        for _ in range(passes):
            sampler.sample(pids)
        return (time.process_time() - start) / passes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    per_pass = pass_cost(args.ranks)
    print(f"pass: {per_pass:.0f} us CPU per GpuSampler pass ({args.ranks} devices, "
          f"{args.ranks} ranks) = {per_pass / 1e4:.3f}% of a core at 1 Hz", flush=True)
    runs: dict[str, list[float]] = {"off": [], "gpu": []}
    with tempfile.TemporaryDirectory(prefix="gpu-cost-") as tmp:
        for rep in range(args.reps):
            for mode in ("off", "gpu"):
                work = Path(tmp) / f"{rep}"
                work.mkdir(exist_ok=True)
                runs[mode].append(one_run(mode, args.ranks, args.window, work))
                print(f"run {rep} {mode}: {runs[mode][-1]:.2f}% of a core", flush=True)
    off, on = statistics.median(runs["off"]), statistics.median(runs["gpu"])
    print(f"supervisor CPU, median of {args.reps}: off {off:.2f}%, gpu {on:.2f}% "
          f"(min-max {min(runs['gpu']):.2f}-{max(runs['gpu']):.2f}); "
          f"GPU sampler: {on - off:+.2f}% of a core (goal <= 2%)")
    if args.json:
        args.json.write_text(json.dumps({"pass_us": per_pass, "runs": runs, "ranks": args.ranks,
                                         "window_s": args.window}, indent=2) + "\n")


if __name__ == "__main__":
    main()
