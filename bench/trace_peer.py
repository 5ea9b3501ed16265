"""Scenario b of run.py (rank exit -> surviving peer has SIGTERM) taken apart.

    /work/venv/bin/python bench/trace_peer.py [--reps 15]

Runs b's ranks (2 x ranks/waiter.py; rank 1 exits 2 once both are ready) under forgelm-tui
--no-tui, in-process (``--inner``) with timestamps (time.time) added at:

  select   every return of the event loop's epoll ``select`` with something ready
  on_exit  entry of ``Supervisor._on_exit`` (the rank's pidfd was readable and reaped)
  killpg   return of ``signal_group`` (the SIGTERM to rank 0's group has been sent)
  sample   start and end of each ``RankSampler.sample`` (the psutil reads, in a worker thread)

With the ranks' own times (exit-1: right before ``os._exit``; term-0: rank 0 has the signal)
that splits the latency into: exit -> the loop wakes, wake -> ``_on_exit`` runs (other ready
callbacks first), ``_on_exit`` -> SIGTERM sent (the supervisor's Python), SIGTERM sent -> rank 0
has it (kernel + rank 0's wake-up). The wrapping adds a few microseconds. Out: a table on stdout,
raw numbers in bench/out/TIME/trace_peer.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def inner(trace_path: Path, args: list[str]) -> None:
    """Run forgelm-tui's CLI in this process with the timestamps added; write them at the end."""
    import selectors

    from forgelm_tui.engine import processes, sampler, supervisor

    trace: dict[str, list[Any]] = {"select": [], "on_exit": [], "killpg": [], "sample": []}
    select = selectors.EpollSelector.select

    def traced_select(self: selectors.EpollSelector, timeout: float | None = None) -> Any:
        ready = select(self, timeout)
        if ready:
            trace["select"].append(time.time())
        return ready

    on_exit = supervisor.Supervisor._on_exit

    def traced_on_exit(self: supervisor.Supervisor, record: Any, returncode: int) -> None:
        trace["on_exit"].append([time.time(), record.rank])
        on_exit(self, record, returncode)

    signal_group = getattr(processes, "signal_group")  # noqa: B009 (patched below)

    def traced_signal_group(pgid: int, sig: int) -> bool:
        sent = bool(signal_group(pgid, sig))
        trace["killpg"].append([time.time(), pgid, sig])
        return sent

    sample = sampler.RankSampler.sample

    def traced_sample(self: sampler.RankSampler) -> Any:
        start = time.time()
        try:
            return sample(self)
        finally:
            trace["sample"].append([start, time.time()])

    # Monkeypatching: setattr, as none of this is meant to type-check.
    setattr(selectors.EpollSelector, "select", traced_select)  # noqa: B010
    setattr(supervisor.Supervisor, "_on_exit", traced_on_exit)  # noqa: B010
    setattr(processes, "signal_group", traced_signal_group)  # noqa: B010
    setattr(sampler.RankSampler, "sample", traced_sample)  # noqa: B010
    from forgelm_tui import cli

    code = cli.main(args)
    trace_path.write_text(json.dumps(trace))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def one(ctx: Any, rep: int) -> dict[str, Any]:
    import run as suite

    slot = ctx.slot("trace-peer", "forgelm-tui", rep)
    target = suite.rank_target("waiter.py", str(slot), "--exit-ranks", "1", "--exit-code", "2")
    argv = suite.launcher_argv(suite.A, 2, slot / "run", *target)
    traced = [sys.executable, str(Path(__file__).resolve()), "--inner", str(slot / "trace.json"),
              "--", *argv[1:]]
    started = time.time()
    ended = suite.Launch(traced, slot / "launcher", cwd=slot, env=ctx.env).wait(90)
    suite.no_leftovers(slot, 2)
    exited = suite.evidence(slot, "exit", 2, timeout=0)
    got = suite.evidence(slot, "term", 2, timeout=0)
    ready = suite.evidence(slot, "ready", 2, timeout=0)
    if ended.rc != 2 or 1 not in exited or 0 not in got or 0 not in ready:
        raise suite.BenchError(f"trace: run did not behave (rc {ended.rc}); see {slot}")
    trace = json.loads((slot / "trace.json").read_text())
    exit_t, term_t = float(exited[1]), float(got[0])
    rank0_pid = int(ready[0].split()[0])
    wake = min(t for t in trace["select"] if t >= exit_t)
    on_exit = min(t for t, rank in trace["on_exit"] if rank == 1)
    sent = min(t for t, pgid, sig in trace["killpg"] if pgid == rank0_pid and sig == 15)
    sampling = any(start <= exit_t + 0.001 and end >= exit_t - 0.005
                   for start, end in trace["sample"])
    return {"total": term_t - exit_t, "exit_to_wake": wake - exit_t,
            "wake_to_on_exit": on_exit - wake, "on_exit_to_sent": sent - on_exit,
            "sent_to_received": term_t - sent, "sampler_running": sampling,
            "after_start_s": exit_t - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inner", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    if opts.inner is not None:
        inner(opts.inner, opts.args[1:] if opts.args[:1] == ["--"] else opts.args)
        return 0
    sys.path.insert(0, str(BENCH))
    import run as suite

    out = BENCH / "out" / ("trace-peer-" + time.strftime("%Y%m%d-%H%M%S"))
    ctx = suite.Ctx(out)
    load = suite.wait_quiet(0.5, 30)
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(opts.reps):
            rows.append(one(ctx, rep))
    finally:
        suite.kill_leftovers()
    keys = ("total", "exit_to_wake", "wake_to_on_exit", "on_exit_to_sent", "sent_to_received")
    print(f"load before: {load['busy_cpus']} CPUs busy; {len(rows)} runs\n")
    print("| phase | median ms | min-max ms |\n|---|---|---|")
    for key in keys:
        values = [r[key] * 1000 for r in rows]
        print(f"| {key.replace('_', ' ')} | {statistics.median(values):.2f} | "
              f"{min(values):.2f}-{max(values):.2f} |")
    after = [r["after_start_s"] for r in rows]
    print(f"\nrank 1 exited {statistics.median(after):.2f} s after launch (median; "
          f"{min(after):.2f}-{max(after):.2f})")
    busy = [r for r in rows if r["sampler_running"]]
    print(f"runs with a psutil sample running at the exit: {len(busy)} of {len(rows)}"
          + (f" (their totals: {[round(r['total'] * 1000, 2) for r in busy]} ms)" if busy else ""))
    (out / "trace_peer.json").write_text(json.dumps({"load_before": load, "runs": rows},
                                                    indent=2) + "\n")
    print(f"raw: {out / 'trace_peer.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
