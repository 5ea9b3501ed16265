"""The control plane at N nodes: what the store carries, what each supervisor costs (issue 23).

    .venv/bin/python bench/scale.py [--nodes 2,4,8,16] [--ranks 1,8] [--window 10] [--settle 30]
                                    [--fail-runs R] [--fail-after S] [--out DIR]

For each N (supervisors on 127.0.0.1, one machine) and K (ranks a node): N ``forgelm-tui
--no-tui --nnodes N --node-rank i --master-addr 127.0.0.1 --master-port P --nproc-per-node K``,
the ranks ``bench/ranks/stepper.py`` (torch-free: each reports a step and a loss on the channel
twice a second, as the issue's measurement did), running long enough for the window.

- **join**: from the first supervisor's start to every rank's ready file.
- **store bytes/s** over ``--window`` seconds, ``--settle`` seconds after the join (a rank's
  curve, in every heartbeat today, grows to 200 points a metric), both directions, measured
  on the control store's TCP connections (port P + 1, node 0's): ``ss -tin`` on the server
  side of every established connection, its ``bytes_received`` (nodes -> store) and
  ``bytes_sent`` (store -> nodes), at the window's start and end (a connection made during the
  window counts from 0).
- **node 0 CPU** and the mean over the other supervisors, % of one core over the window
  (utime+stime of the supervisor process from /proc), and each supervisor's RSS at the end of
  the window (VmRSS, MiB: mean and max).
- **exit**: every supervisor's exit code once the ranks end (all 0: the bench asks them to,
  through a file, when the window is over), and how long that took.

- with ``--fail-runs R``, then R runs per N x K whose last rank exits 2 two seconds after the
  join: **failure -> every rank signalled** (the latest first stop signal among the other
  ranks, from node 0's envelope, against the failing rank's own ``time.time()``), **-> every
  supervisor exited**, every exit 2; median and max over the runs. The ranks die of their
  SIGTERM at once (its default action), or with ``--graceful-ranks`` end at the end of their
  step (a trainer that finishes its step first): on one machine the first puts every rank's
  death (~0.6-1 ms of CPU each) on the same 2 cores as the fan-out (bench/RESULTS.md,
  session 23).

- with ``--viewer``, a viewer attached to node 0 during the steady runs (what rank details
  cost while someone views them): ``--viewer all`` shows every node's ranks (a view that
  lists every rank: every node writes its ranks' views), ``--viewer rows`` only the node rows
  (a grouped TUI with no node opened: every node writes its row only);
- with ``--launchers forgelm-tui,torchrun``, the same for torchrun (``--rdzv-backend c10d``, its
  store on P, hosted by the first agent): its store bytes/s, and for a failure how long until
  every agent exited (at most 60 s) and how many ranks still ran then. ``--window 0``: the
  failure runs only. Raw numbers to OUT/scale.json, a table to
stdout and OUT/scale.md. No timing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from multinode import port_pair  # bench/multinode.py: P and P + 1 free (the control store)

ROOT = Path(__file__).resolve().parent.parent
FTUI = os.environ.get("BENCH_FORGELM_TUI", str(Path(sys.executable).parent / "forgelm-tui"))
STEPPER = str(ROOT / "bench" / "ranks" / "stepper.py")
RANK_MODE: list[str] = []  # --graceful-ranks: ["--graceful"]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TICK = os.sysconf("SC_CLK_TCK")
CONN = re.compile(r"(\S+)\s+(\S+)\s*$")


def store_bytes(port: int) -> dict[str, tuple[int, int]]:
    """Per established connection on the store's port, server side: (received, sent)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    found: dict[str, tuple[int, int]] = {}
    key = None
    for line in out.splitlines():
        if not line.startswith(("\t", " ")):
            match = CONN.search(line)
            key = match.group(0) if match else None
            continue
        if key is None:
            continue
        received = re.search(r"bytes_received:(\d+)", line)
        sent = re.search(r"bytes_sent:(\d+)", line)
        found[key] = (int(received.group(1)) if received else 0,
                      int(sent.group(1)) if sent else 0)
    return found


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def command(launcher: str, nodes: int, node: int, ranks: int, port: int, slot: Path,
            node_timeout: float) -> list[str]:
    """One node's launcher: forgelm-tui (its control store on P + 1), or torchrun's c10d
    rendezvous (its store on P, hosted by the first agent), the same stepper ranks."""
    ranks_argv = [STEPPER, str(slot / "marks"), "600", "2", *RANK_MODE]  # ended by marks/stop
    if launcher == "torchrun":
        return [TORCHRUN, "--nnodes", str(nodes), "--nproc-per-node", str(ranks),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", slot.name, "--max-restarts", "0", *ranks_argv]
    return [FTUI, "--no-tui", "--run-dir", str(slot / "run"), "--nnodes", str(nodes),
            "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
            str(port), "--nproc-per-node", str(ranks), "--join-timeout", "300",
            "--node-timeout", str(node_timeout), *ranks_argv]


def store_port(launcher: str, port: int) -> int:
    return port if launcher == "torchrun" else port + 1


def launch(nodes: int, ranks: int, out: Path, node_timeout: float, launcher: str = "forgelm-tui",
           ) -> tuple[list[subprocess.Popen[bytes]], Path, int, float]:
    """N launchers of K stepper ranks each; returns them, the marks dir, the port, and how
    long until every rank wrote its ready file."""
    port = port_pair()
    slot = Path(tempfile.mkdtemp(prefix=f"scale-{launcher}-{nodes}x{ranks}-", dir=out))
    marks = slot / "marks"
    marks.mkdir()
    began = time.monotonic()
    procs = []
    for node in range(nodes):
        cmd = command(launcher, nodes, node, ranks, port, slot, node_timeout)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
    while len(list(marks.glob("ready-*"))) < nodes * ranks:
        if any(p.poll() is not None for p in procs) or time.monotonic() - began > 300:
            for p in procs:
                p.kill()
            said = [f"node {i}: exit {p.wait()}: {p.stderr.read().decode()[-600:]}"
                    for i, p in enumerate(procs) if p.stderr is not None]
            raise SystemExit(f"{nodes}x{ranks}: the ranks did not all start\n"
                             + "\n".join(said))
        time.sleep(0.1)
    return procs, marks, port, time.monotonic() - began


class Viewer:
    """An attached viewer on node 0 (what ``forgelm-tui attach`` is, without a screen): every
    node then writes its row, and its ranks' views when the viewer shows every node's ranks
    (``rows_only`` false); node 0 reads them (cluster/views.py)."""

    def __init__(self, slot: Path, rows_only: bool) -> None:
        from forgelm_tui.control.client import ControlClient, ControlError

        path = slot / "run" / "node-0" / "control.sock"
        self.client = ControlClient(path, output="tail")
        if rows_only:
            self.client.send("watch", nodes=[])  # a grouped TUI with no node opened
        self.items = 0
        self._error = ControlError
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                self.client.next_item()
                self.items += 1
        except (self._error, OSError, ValueError):
            return

    def close(self) -> None:
        self.client.close()


def run_one(nodes: int, ranks: int, window: float, settle: float, out: Path,
            node_timeout: float, launcher: str = "forgelm-tui",
            viewer: str | None = None) -> dict[str, Any]:
    procs, marks, port, join = launch(nodes, ranks, out, node_timeout, launcher)
    watching = Viewer(marks.parent, viewer == "rows") if viewer else None
    time.sleep(settle)  # past the join; the curves (metrics history) grow meanwhile
    port = store_port(launcher, port)
    bytes0, cpu0 = store_bytes(port), [cpu_seconds(p.pid) for p in procs]
    t0 = time.monotonic()
    time.sleep(window)
    bytes1, cpu1 = store_bytes(port), [cpu_seconds(p.pid) for p in procs]
    elapsed = time.monotonic() - t0
    rss = [rss_mib(p.pid) for p in procs]
    received = sum(r - bytes0.get(k, (0, 0))[0] for k, (r, _) in bytes1.items())
    sent = sum(s - bytes0.get(k, (0, 0))[1] for k, (_, s) in bytes1.items())
    cpu = [100 * (b - a) / elapsed for a, b in zip(cpu0, cpu1, strict=True)]
    window_end = time.monotonic()
    if watching is not None:
        watching.close()
    (marks / "stop").touch()
    codes = [p.wait(timeout=120) for p in procs]
    return {
        "launcher": launcher + (f" + viewer ({viewer})" if viewer else ""), "nodes": nodes,
        "ranks_per_node": ranks, "world": nodes * ranks,
        "join_s": round(join, 2), "window_s": round(elapsed, 2), "connections": len(bytes1),
        "store_in_Bps": round(received / elapsed), "store_out_Bps": round(sent / elapsed),
        "node0_cpu_pct": round(cpu[0], 1),
        "other_cpu_pct_mean": round(statistics.mean(cpu[1:]), 1) if nodes > 1 else None,
        "rss_mib_mean": round(statistics.mean(rss), 1), "rss_mib_max": round(max(rss), 1),
        "exit_codes": codes, "exit_after_window_s": round(time.monotonic() - window_end, 1),
    }


def fail_once(nodes: int, ranks: int, out: Path, node_timeout: float,
              fail_after: float) -> dict[str, Any]:
    """The last rank (on the last node) exits 2, ``fail_after`` seconds after every rank
    started: how long until every other rank got its stop
    signal (from node 0's envelope, ms resolution, one machine so one clock), and until every
    supervisor exited; every exit must be 2."""
    procs, marks, _, _ = launch(nodes, ranks, out, node_timeout)
    time.sleep(fail_after)
    (marks / "fail").touch()
    deadline = time.monotonic() + 120
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.005)
    exited = time.time()
    codes = [p.wait(timeout=5) for p in procs]
    failed_at = float((marks / "failed-at").read_text())
    envelope = json.loads((marks.parent / "run" / "node-0" / "envelope.json").read_text())
    delays = []
    for rank in envelope["ranks"]:
        stops = [s for s in rank["signals_sent"] if s["purpose"] == "stop"]
        if rank["rank"] != nodes * ranks - 1 and stops:
            delays.append(datetime.fromisoformat(stops[0]["at"]).timestamp() - failed_at)
    missed = nodes * ranks - 1 - len(delays)
    return {"signalled_max_ms": round(1000 * max(delays), 1) if delays else None,
            "signalled_median_ms": round(1000 * statistics.median(delays), 1) if delays else None,
            "not_signalled": missed, "exited_ms": round(1000 * (exited - failed_at), 1),
            "exit_codes": codes}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def torchrun_fail_once(nodes: int, ranks: int, out: Path, fail_after: float,
                       cap: float = 60.0) -> dict[str, Any]:
    """torchrun's teardown of the same failure: how long until every agent exited (at most
    ``cap`` s; then the stepper ranks are asked to end), their codes, and how many ranks
    were still running at the cap (its agents learn of another node's failure only through
    their own ranks: a torch-free rank never does)."""
    procs, marks, _, _ = launch(nodes, ranks, out, 10.0, "torchrun")
    pids = [int(f.read_text().split()[0]) for f in marks.glob("ready-*")]
    time.sleep(fail_after)
    (marks / "fail").touch()
    deadline = time.monotonic() + cap
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.005)
    exited = time.time()
    running = sum(p.poll() is None for p in procs)
    ranks_left = sum(_alive(pid) for pid in pids)
    (marks / "stop").touch()  # the other ranks end with 0; their agents may still wait
    end = time.monotonic() + 15  # (torchrun's exit barrier: on a store whose host is gone)
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        time.sleep(0.05)
    stuck = sum(p.poll() is None for p in procs)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    codes = [p.wait(timeout=30) for p in procs]
    failed_at = float((marks / "failed-at").read_text())
    return {"exited_ms": round(1000 * (exited - failed_at), 1) if not running else None,
            "agents_running_at_cap": running, "ranks_running_at_cap": ranks_left,
            "agents_killed_15s_after_ranks_ended": stuck, "exit_codes": codes}


def failures(nodes: int, ranks: int, runs: int, out: Path, node_timeout: float,
             fail_after: float, launcher: str = "forgelm-tui") -> dict[str, Any]:
    if launcher == "torchrun":
        rows = [torchrun_fail_once(nodes, ranks, out, fail_after) for _ in range(runs)]
        ended = [r["exited_ms"] for r in rows if r["exited_ms"] is not None]
        return {"launcher": launcher, "nodes": nodes, "ranks_per_node": ranks, "runs": runs,
                "exited_ms_median": round(statistics.median(ended), 1) if ended else None,
                "runs_with_agents_running_at_60s": sum(bool(r["agents_running_at_cap"])
                                                       for r in rows),
                "ranks_running_at_60s_max": max(r["ranks_running_at_cap"] for r in rows),
                "each": rows}
    rows = [fail_once(nodes, ranks, out, node_timeout, fail_after) for _ in range(runs)]
    worst = [r["signalled_max_ms"] for r in rows if r["signalled_max_ms"] is not None]
    return {"launcher": launcher, "nodes": nodes, "ranks_per_node": ranks, "runs": runs,
            "fail_after_s": fail_after, "ranks_on_sigterm": "graceful" if RANK_MODE else "die",
            "signalled_max_ms_median": round(statistics.median(worst), 1) if worst else None,
            "signalled_max_ms_max": max(worst) if worst else None,
            "exited_ms_median": round(statistics.median(r["exited_ms"] for r in rows), 1),
            "all_exit_2": all(set(r["exit_codes"]) == {2} for r in rows),
            "not_signalled": sum(r["not_signalled"] for r in rows), "each": rows}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| launcher | nodes x ranks | join s | store in KiB/s | store out KiB/s | "
             "total KiB/s | node 0 CPU % | other CPU % | RSS MiB mean/max | exits |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        total = (r["store_in_Bps"] + r["store_out_Bps"]) / 1024
        lines.append(
            f"| {r['launcher']} | {r['nodes']} x {r['ranks_per_node']} | {r['join_s']} | "
            f"{r['store_in_Bps'] / 1024:.1f} | {r['store_out_Bps'] / 1024:.1f} | {total:.1f} | "
            f"{r['node0_cpu_pct']} | {r['other_cpu_pct_mean']} | "
            f"{r['rss_mib_mean']}/{r['rss_mib_max']} | "
            f"{'all 0' if set(r['exit_codes']) == {0} else r['exit_codes']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="2,4,8,16")
    parser.add_argument("--ranks", default="1,8")
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--fail-runs", type=int, default=0,
                        help="then, per N x K, this many runs whose last rank exits 2: "
                             "failure -> every rank signalled, -> every supervisor exited")
    parser.add_argument("--fail-after", type=float, default=2.0,
                        help="seconds between every rank's start and the failure (on 2 cores "
                             "the supervisors' and ranks' start-up is still under way at 2 s)")
    parser.add_argument("--node-timeout", type=float, default=10.0,
                        help="forgelm-tui's --node-timeout (16 nodes starting on 2 cores "
                             "starve a heartbeat past the default 10 s)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="seconds between every rank's start and the window")
    parser.add_argument("--launchers", default="forgelm-tui",
                        help="forgelm-tui, torchrun or both (forgelm-tui,torchrun)")
    parser.add_argument("--viewer", nargs="?", const="all", choices=("all", "rows"),
                        help="forgelm-tui with a viewer attached to node 0 for the steady runs: "
                             "all (the default) shows every node's ranks, rows the node rows "
                             "only (a grouped TUI with no node opened)")
    parser.add_argument("--graceful-ranks", action="store_true",
                        help="the ranks end at the end of their step on SIGTERM (as a trainer "
                        "that finishes its step does) instead of dying of it at once: the "
                        "fan-out without 255 deaths on the same 2 cores at the same moment")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "scale")
    opts = parser.parse_args()
    RANK_MODE[:] = ["--graceful"] if opts.graceful_ranks else []
    launchers = opts.launchers.split(",")
    opts.out.mkdir(parents=True, exist_ok=True)
    rows = []
    shapes = [(int(n), int(k)) for k in opts.ranks.split(",") for n in opts.nodes.split(",")]
    for launcher in launchers:
        for nodes, ranks in shapes if opts.window > 0 else ():
            row = run_one(nodes, ranks, opts.window, opts.settle, opts.out, opts.node_timeout,
                          launcher, opts.viewer if launcher == "forgelm-tui" else None)
            print(json.dumps(row), flush=True)
            rows.append(row)
    fails = []
    for launcher in launchers if opts.fail_runs else ():
        for nodes, ranks in shapes:
            found = failures(nodes, ranks, opts.fail_runs, opts.out, opts.node_timeout,
                             opts.fail_after, launcher)
            print(json.dumps({k: v for k, v in found.items() if k != "each"}), flush=True)
            fails.append(found)
    (opts.out / "scale.json").write_text(json.dumps({"steady": rows, "failure": fails},
                                                    indent=1))
    text = table(rows)
    (opts.out / "scale.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
