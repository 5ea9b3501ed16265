"""The control plane at N nodes: what the store carries, what each supervisor costs (issue 23).

    .venv/bin/python bench/scale.py [--nodes 2,4,8,16] [--ranks 1,8] [--window 10] [--settle 30]
                                    [--out DIR]

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

Only the steady state is measured here so far: the failure fan-out and torchrun's store
traffic for the same N are issue 23's next step. Raw numbers to OUT/scale.json, a table to
stdout and OUT/scale.md. No timing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FTUI = os.environ.get("BENCH_FORGELM_TUI", str(Path(sys.executable).parent / "forgelm-tui"))
STEPPER = str(ROOT / "bench" / "ranks" / "stepper.py")
TICK = os.sysconf("SC_CLK_TCK")
CONN = re.compile(r"(\S+)\s+(\S+)\s*$")


def port_pair() -> int:
    """A port P with P and P + 1 free (rank 0's store, the control store)."""
    for _ in range(200):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            if port >= 65534:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise SystemExit("no free pair of ports")


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


def run_one(nodes: int, ranks: int, window: float, settle: float, out: Path,
            node_timeout: float) -> dict[str, Any]:
    port = port_pair()
    slot = Path(tempfile.mkdtemp(prefix=f"scale-{nodes}x{ranks}-", dir=out))
    marks = slot / "marks"
    marks.mkdir()
    seconds = 600  # the ranks end when the window is measured (marks/stop)
    began = time.monotonic()
    procs = []
    for node in range(nodes):
        cmd = [FTUI, "--no-tui", "--run-dir", str(slot / "run"), "--nnodes", str(nodes),
               "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
               str(port), "--nproc-per-node", str(ranks), "--join-timeout", "300",
               "--node-timeout", str(node_timeout),
               STEPPER, str(marks), f"{seconds:g}", "2"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
    world = nodes * ranks
    while len(list(marks.glob("ready-*"))) < world:
        if any(p.poll() is not None for p in procs) or time.monotonic() - began > 300:
            for p in procs:
                p.kill()
            said = [f"node {i}: exit {p.wait()}: {p.stderr.read().decode()[-600:]}"
                    for i, p in enumerate(procs) if p.stderr is not None]
            raise SystemExit(f"{nodes}x{ranks}: the ranks did not all start\n"
                             + "\n".join(said))
        time.sleep(0.1)
    join = time.monotonic() - began
    time.sleep(settle)  # past the join; the curves (metrics history) grow meanwhile
    bytes0, cpu0 = store_bytes(port + 1), [cpu_seconds(p.pid) for p in procs]
    t0 = time.monotonic()
    time.sleep(window)
    bytes1, cpu1 = store_bytes(port + 1), [cpu_seconds(p.pid) for p in procs]
    elapsed = time.monotonic() - t0
    rss = [rss_mib(p.pid) for p in procs]
    received = sum(r - bytes0.get(k, (0, 0))[0] for k, (r, _) in bytes1.items())
    sent = sum(s - bytes0.get(k, (0, 0))[1] for k, (_, s) in bytes1.items())
    cpu = [100 * (b - a) / elapsed for a, b in zip(cpu0, cpu1, strict=True)]
    window_end = time.monotonic()
    (marks / "stop").touch()
    codes = [p.wait(timeout=120) for p in procs]
    return {
        "nodes": nodes, "ranks_per_node": ranks, "world": world, "join_s": round(join, 2),
        "window_s": round(elapsed, 2), "connections": len(bytes1),
        "store_in_Bps": round(received / elapsed), "store_out_Bps": round(sent / elapsed),
        "node0_cpu_pct": round(cpu[0], 1),
        "other_cpu_pct_mean": round(statistics.mean(cpu[1:]), 1) if nodes > 1 else None,
        "rss_mib_mean": round(statistics.mean(rss), 1), "rss_mib_max": round(max(rss), 1),
        "exit_codes": codes, "exit_after_window_s": round(time.monotonic() - window_end, 1),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| nodes x ranks | join s | store in KiB/s | store out KiB/s | total KiB/s | "
             "node 0 CPU % | other CPU % | RSS MiB mean/max | exits |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        total = (r["store_in_Bps"] + r["store_out_Bps"]) / 1024
        lines.append(
            f"| {r['nodes']} x {r['ranks_per_node']} | {r['join_s']} | "
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
    parser.add_argument("--node-timeout", type=float, default=10.0,
                        help="forgelm-tui's --node-timeout (16 nodes starting on 2 cores "
                             "starve a heartbeat past the default 10 s)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="seconds between every rank's start and the window")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "scale")
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for ranks in (int(k) for k in opts.ranks.split(",")):
        for nodes in (int(n) for n in opts.nodes.split(",")):
            row = run_one(nodes, ranks, opts.window, opts.settle, opts.out, opts.node_timeout)
            print(json.dumps(row), flush=True)
            rows.append(row)
    (opts.out / "scale.json").write_text(json.dumps(rows, indent=1))
    text = table(rows)
    (opts.out / "scale.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
