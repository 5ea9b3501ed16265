"""Multi-node forgelm-tui against torchrun: two local "nodes" on this machine, same run.

    /work/venv/bin/python bench/multinode.py [--runs 20] [--quick] [--only ok,fail]

Each "node" is one launcher process started with ``--nnodes 2 --node-rank i --master-addr
127.0.0.1 --master-port P --nproc-per-node K`` (K = 1 by default: two cores); torchrun keeps its
static rendezvous. P comes from binding port 0, with P + 1 checked free as well (forgelm-tui's
control store). The ranks run ``bench/ranks/gloo_loop.py``, a gloo all_reduce loop on CPU:

  ok        every rank loops ~5 s and exits 0: exit codes, and each launcher process's peak RSS
            and CPU, against one single-node forgelm-tui running the same 2K ranks and a plain
            python that only imports torch.distributed (what the control store costs)
  approval  every rank passes a barrier, then os._exit(4) (ForgeLM's awaiting approval)
  rank0     the same barrier, then rank 0 os._exit(4), the others os._exit(0)
  fail      rank K (the first on node 1) os._exit(2) after 1 s of the loop, the others being in
            it: exit codes; failure -> every other rank signalled; failure -> launchers exited

Runs alternate launchers (forgelm-tui, torchrun, ...) after one untimed warm-up of each.

- Launcher ends are seen through pidfds in one poll; the CPU of each launcher process is
  utime+stime of its zombie (waitid WNOWAIT, as bench/run.py), its peak RSS is VmHWM (and the
  max of VmRSS) read from /proc/PID/status every 50 ms while it runs.
- The failure's anchor is the failing rank's own ``time.time()`` right before ``os._exit``.
  forgelm-tui's "every rank signalled" comes from node 0's envelope: the failing rank's
  ``ended_at`` (and the anchor) to the latest first ``signals_sent`` entry with purpose
  ``stop`` among the other ranks (ms resolution; one machine, so one clock). "Launcher exited"
  is the bench's ``time.time()`` when the pidfd fired. torchrun signals no rank for a remote
  failure: its ranks die of the gloo error (each records it in ``gloo-error-RANK``); the exit
  codes its agents report are parsed from their error summaries.
- After every run, any process whose command line holds the run's directory (ranks,
  supervisors, guardians, agents) still alive 2 s after the last launcher ended is an orphan.
  forgelm-tui with a wrong exit code, a missing envelope, a hang (120 s) or an orphan stops
  the bench with the evidence kept; torchrun's are recorded.
- Before each case (30 s) and each run (2 s) the bench waits a bounded time for fewer than 0.5
  CPUs busy with other work, and records the load it saw with the run.

Raw numbers go to bench/multinode.json (with --quick: the out dir), tables to OUT/tables.md,
launcher output and run dirs to bench/out/multinode-TIME/. No timing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # bench/run.py: process helpers, load probe, metadata

BENCH, ROOT, FTUI, TORCHRUN = base.BENCH, base.ROOT, base.FTUI, base.TORCHRUN
RANK_PROGRAM = BENCH / "ranks" / "gloo_loop.py"
SAMPLE_S = 0.05  # /proc/PID/status of every launcher process, while they run

EXAMPLE_ARGV: dict[str, list[list[str]]] = {}  # one run's launcher command lines, per label
F2, F1, T2 = "forgelm-tui, 2 nodes", "forgelm-tui, 1 node", "torchrun, 2 nodes"
FLOOR = "floor: python -c 'import torch.distributed'"
EXPECTED_FTUI = {"ok": 0, "approval": 4, "rank0": 4, "fail": 2}  # both nodes, SPEC §5/§8
EXITCODE_LINE = re.compile(r"exitcode\s*:\s*(-?\d+)")


class BenchError(Exception):
    """forgelm-tui misbehaved (wrong code, hang, orphan) or evidence is missing: stop here."""


# ------------------------------------------------------------------------- ports


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    with socket.socket() as sock:  # node 0's control store listens on every address
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def port_pair() -> int:
    """A port P from the kernel (bind to 0) such that P + 1 is free too (the control store)."""
    for _ in range(100):
        port = base.free_port()
        if port < 65534 and _bindable(port) and _bindable(port + 1):
            return port
    raise BenchError("no free port pair P, P+1 found in 100 tries")


# ------------------------------------------------------------------------- processes


@dataclass
class Node:
    """One launcher process: a forgelm-tui supervisor or a torchrun agent."""

    node_rank: int
    argv: list[str]
    popen: subprocess.Popen[bytes]
    pidfd: int
    me: base.Proc | None
    started: float  # time.monotonic() right before Popen
    rc: int | None = None
    ended_wall: float | None = None  # time.time() when its pidfd said it had ended
    ended_mono: float | None = None
    own_cpu: float | None = None  # utime+stime of the zombie (/proc/PID/stat)
    children_cpu: float | None = None  # cutime+cstime: its reaped children (ranks, guardian)
    peak_rss_kib: int = 0  # max VmRSS over the 50 ms samples
    hwm_kib: int = 0  # last VmHWM read (the kernel's own peak, up to the last sample)
    samples: int = 0

    def record(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("popen", "me", "pidfd", "argv")}
        out["pid"] = self.popen.pid
        return out


class Group:
    """The launcher processes of one run, watched together: pidfds in one poll, /proc sampled
    every 50 ms for VmRSS / VmHWM; each end is seen when its pidfd fires, its CPU read from
    the zombie (waitid WNOWAIT), then it is reaped."""

    def __init__(self, argvs: Sequence[list[str]], slot: Path, env: dict[str, str]) -> None:
        self.slot = slot
        self.nodes: list[Node] = []
        self._files = []
        for index, argv in enumerate(argvs):
            stdout = open(slot / f"launcher-{index}.stdout", "wb")  # noqa: SIM115
            stderr = open(slot / f"launcher-{index}.stderr", "wb")  # noqa: SIM115
            self._files += [stdout, stderr]
            started = time.monotonic()
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout,
                                     stderr=stderr, cwd=slot, env=env, start_new_session=True)
            node = Node(index, argv, popen, os.pidfd_open(popen.pid), base.Proc.of(popen.pid),
                        started)
            if node.me is not None:
                base.KNOWN.add(node.me)
            self.nodes.append(node)

    def wait(self, timeout: float) -> None:
        poller = select.poll()
        fds = {n.pidfd: n for n in self.nodes}
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        live = set(fds)
        try:
            while live:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"timed out after {timeout:g} s: launcher(s) "
                                     f"{[fds[f].node_rank for f in live]} still running; "
                                     f"see {self.slot}")
                for fd, _ in poller.poll(min(left, SAMPLE_S) * 1000):
                    self._ended(fds[fd])
                    poller.unregister(fd)
                    live.discard(fd)
                for fd in live:
                    self._sample(fds[fd])
        finally:
            self.kill()

    def _sample(self, node: Node) -> None:
        rss = base.vm_kib(node.popen.pid, "VmRSS")
        hwm = base.vm_kib(node.popen.pid, "VmHWM")
        if rss is not None:
            node.peak_rss_kib = max(node.peak_rss_kib, rss)
            node.samples += 1
        if hwm is not None:
            node.hwm_kib = max(node.hwm_kib, hwm)

    def _ended(self, node: Node) -> None:
        node.ended_wall, node.ended_mono = time.time(), time.monotonic()
        pid = node.popen.pid
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        stat = base.read_stat(pid) or []
        _, status, _ = os.wait4(pid, 0)
        node.rc = node.popen.returncode = os.waitstatus_to_exitcode(status)
        if stat:
            node.own_cpu = (int(stat[11]) + int(stat[12])) / base.CLK_TCK
            node.children_cpu = (int(stat[13]) + int(stat[14])) / base.CLK_TCK
        with contextlib.suppress(OSError):
            os.close(node.pidfd)

    def kill(self) -> None:
        """SIGKILL whatever launcher is still running, and everything under it."""
        for node in self.nodes:
            if node.rc is None:
                for pid in [node.popen.pid, *base.descendants(node.popen.pid)]:
                    proc = base.Proc.of(pid)
                    if proc is not None:
                        base.KNOWN.add(proc)
                        proc.kill()
                with contextlib.suppress(ChildProcessError):
                    _, status = os.waitpid(node.popen.pid, 0)
                    node.rc = node.popen.returncode = os.waitstatus_to_exitcode(status)
                with contextlib.suppress(OSError):
                    os.close(node.pidfd)
        for handle in self._files:
            handle.close()


def processes_mentioning(text: str) -> list[base.Proc]:
    """Live (non-zombie) processes whose command line holds ``text`` (the run's slot path:
    every rank, supervisor, guardian and agent of a run has it in its argv)."""
    found = []
    needle = text.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                if needle not in handle.read():
                    continue
            proc = base.Proc.of(int(name))
            if proc is not None and proc.alive():
                found.append(proc)
    return found


def orphans_after(slot: Path, patience: float = 2.0) -> dict[str, Any]:
    """Processes of this run still alive once every launcher ended: right away, and after
    ``patience`` s (then SIGKILLed, and named)."""
    now = processes_mentioning(str(slot))
    deadline = time.monotonic() + patience
    later = now
    while later and time.monotonic() < deadline:
        time.sleep(0.05)
        later = [p for p in later if p.alive()]
    names = []
    for proc in later:
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/cmdline", "rb") as handle:
            names.append(f"{proc.pid}: " + handle.read().replace(b"\0", b" ").decode()[:200])
        proc.kill()
    return {"at_end": len(now), "after_s": patience, "alive_after": len(later), "who": names}


# ------------------------------------------------------------------------- a run


def quiet(ceiling: float, patience: float) -> dict[str, Any]:
    """Before a run: probe the machine for 0.5 s, again until fewer than ``ceiling`` CPUs are
    busy with other work or ``patience`` s went by; the last probe is recorded with the run."""
    deadline = time.monotonic() + patience
    while True:
        load = base.machine_load(0.5)
        if load["busy_cpus"] < ceiling or time.monotonic() >= deadline:
            return {"busy_cpus": load["busy_cpus"], "loadavg": load["loadavg"],
                    "busy_processes": load["busy_processes"][:5]}
        time.sleep(0.5)


class Ctx:
    def __init__(self, out: Path, nproc: int) -> None:
        self.out = out
        self.nproc = nproc  # ranks per node
        self.env = base.bench_env()
        self.counter = 0
        self.quiet_cpus = 0.5
        self.quiet_run_wait = 0.0
        self.ftui: list[str] = [FTUI]
        self.ftui_env = self.env
        self.pinned: str | None = None

    def pin(self, rev: str) -> str:
        """Run forgelm-tui from ``git archive REV`` (other sessions may commit while the bench
        runs; the editable install would pick every change up): ``python -m forgelm_tui`` with
        the exported tree first on PYTHONPATH, for the supervisors and their ranks alike."""
        commit = git("rev-parse", "--short", rev)
        if not commit:
            raise BenchError(f"--at-commit {rev}: no such commit")
        src = self.out / f"forgelm_tui-{commit}"
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "forgelm_tui"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        self.ftui = [base.PYTHON, "-m", "forgelm_tui"]
        self.ftui_env = dict(self.env)
        self.ftui_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(src), self.env.get("PYTHONPATH", "")) if p)
        self.pinned = commit
        return commit

    def slot(self, case: str, label: str, rep: int) -> Path:
        self.counter += 1
        path = self.out / case / f"{rep:02d}-{label}-{self.counter:03d}"
        path.mkdir(parents=True)
        return path


def argvs(which: str, nproc: int, port: int, slot: Path, target: list[str],
          ftui: Sequence[str] = (FTUI,)) -> list[list[str]]:
    addr = ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    if which == F1:
        return [[*ftui, "--no-tui", "--nproc-per-node", str(2 * nproc), *addr,
                 "--run-dir", str(slot / "run"), *target]]
    if which == F2:
        return [[*ftui, "--no-tui", "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node",
                 str(nproc), *addr, "--run-dir", str(slot / "run"), *target] for i in (0, 1)]
    return [[TORCHRUN, "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", str(nproc),
             *addr, *target] for i in (0, 1)]


CASE_ARGS = {
    "ok": ["--seconds", "5"],
    "approval": ["--seconds", "0.5", "--end-code", "4"],
    "rank0": ["--seconds", "0.5", "--rank0-code", "4"],
    "fail": ["--fail-code", "2", "--fail-after", "1"],
}


def run_once(ctx: Ctx, case: str, which: str, rep: int) -> dict[str, Any]:
    load = quiet(ctx.quiet_cpus, ctx.quiet_run_wait)
    slot = ctx.slot(case, {F2: "ftui2", F1: "ftui1", T2: "torchrun2"}[which], rep)
    extra = list(CASE_ARGS[case])
    fail_rank = ctx.nproc  # the first rank of node 1
    if case == "fail":
        extra += ["--fail-rank", str(fail_rank)]
    target = [str(RANK_PROGRAM), str(slot), *extra]
    port = port_pair()
    commit = ctx.pinned or git("rev-parse", "--short", "HEAD")
    env = ctx.env if which == T2 else ctx.ftui_env
    group = Group(argvs(which, ctx.nproc, port, slot, target, ctx.ftui), slot, env)
    try:
        group.wait(120)
    except BenchError:
        orphans_after(slot, 0)
        raise
    row: dict[str, Any] = {"slot": str(slot.relative_to(ctx.out)), "port": port,
                           "load_before": load, "forgelm_tui_commit": commit,
                           "nodes": [n.record() for n in group.nodes],
                           "rc": [n.rc for n in group.nodes]}
    row["orphans"] = orphans_after(slot)
    world = 2 * ctx.nproc
    row["ranks_ready"] = len(base.evidence(slot, "ready", world, timeout=0))
    ends = [n.ended_wall for n in group.nodes if n.ended_wall is not None]
    starts = [n.started for n in group.nodes]
    row["wall_s"] = max(n.ended_mono or 0 for n in group.nodes) - min(starts)
    row["argv"] = [n.argv for n in group.nodes]
    if which != T2:
        row["envelopes"] = envelopes(slot, len(group.nodes))
    if case == "fail":
        row.update(failure_times(slot, which, world, fail_rank, ends, row.get("envelopes")))
    if which == T2:
        row["torchrun_worker_exitcodes"] = [
            [int(x) for x in EXITCODE_LINE.findall(
                (slot / f"launcher-{i}.stderr").read_text(errors="replace"))]
            for i in range(len(group.nodes))]
    check(case, which, row, slot, world)
    return slim(row)


def slim(row: dict[str, Any]) -> dict[str, Any]:
    """What the JSON keeps of a run: one argv example per launcher goes to the meta, node 1's
    envelope is node 0's but for the node-local fields (its code is kept)."""
    argv = row.pop("argv")
    EXAMPLE_ARGV.setdefault(row["slot"].split("/")[1].split("-")[1], argv)
    envs = row.get("envelopes")
    if envs and len(envs) > 1:
        row["envelopes"] = [envs[0], *({"node_rank": e["node_rank"], "exit_code": e["exit_code"]}
                                       if e else None for e in envs[1:])]
    return row


ENVELOPE_KEEP = ("exit_code", "exit_name", "decided_by", "disagreements", "stop",
                 "root_cause_rank", "agreement", "node_rank", "nnodes", "world_size")
RANK_KEEP = ("rank", "node_rank", "state", "started_at", "ended_at", "exit_code", "signal",
             "signals_sent")


def compact(envelope: dict[str, Any]) -> dict[str, Any]:
    """The envelope fields the bench reads or reports (the whole file stays in the run dir)."""
    out = {k: envelope.get(k) for k in ENVELOPE_KEEP}
    out["ranks"] = [{k: r.get(k) for k in RANK_KEEP} for r in envelope.get("ranks", [])]
    out["nodes"] = [{k: n.get(k) for k in ("node_rank", "state", "pid", "ranks")}
                    for n in envelope.get("nodes") or []]
    return out


def envelopes(slot: Path, nodes: int) -> list[dict[str, Any] | None]:
    found: list[dict[str, Any] | None] = []
    for node in range(nodes):
        path = slot / "run" / (f"node-{node}" if nodes > 1 else "") / "envelope.json"
        try:
            found.append(compact(json.loads(path.read_text())))
        except (OSError, ValueError):
            found.append(None)
    return found


def when(iso: str | None) -> float | None:
    """An envelope time (ISO 8601, ms, UTC 'Z') as seconds since the epoch."""
    if iso is None:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def failure_times(slot: Path, which: str, world: int, fail_rank: int, ends: list[float],
                  envs: list[dict[str, Any] | None] | None) -> dict[str, Any]:
    """The failure's anchor (the rank's own time.time() right before os._exit) against the
    launchers' ends, and (forgelm-tui) the envelope's signal times; how the others died."""
    anchor_text = base.evidence(slot, "exit", world, timeout=0).get(fail_rank)
    if anchor_text is None:
        raise BenchError(f"fail: rank {fail_rank} left no exit-{fail_rank} anchor; see {slot}")
    anchor = float(anchor_text)
    gloo = base.evidence(slot, "gloo-error", world, timeout=0)
    out: dict[str, Any] = {
        "anchor": anchor,
        "to_launcher_exit_s": [e - anchor for e in ends],
        "to_every_launcher_exited_s": max(ends) - anchor,
        "gloo_error_after_s": {str(r): float(t.split()[0]) - anchor for r, t in gloo.items()},
    }
    if which == T2 or not envs or envs[0] is None:
        return out
    last_end = max(when(r["ended_at"]) or 0.0 for r in envs[0]["ranks"])
    out["last_rank_ended_at_to_launcher_exit_s"] = [e - last_end for e in ends]
    ranks = {r["rank"]: r for r in envs[0]["ranks"]}
    failed = ranks[fail_rank]
    failed_end = when(failed["ended_at"])
    firsts: dict[str, float | None] = {}
    died: dict[str, str] = {}
    for rank, record in sorted(ranks.items()):
        if rank == fail_rank:
            continue
        stops = [s for s in record["signals_sent"] if s["purpose"] == "stop"]
        firsts[str(rank)] = when(stops[0]["at"]) if stops else None
        died[str(rank)] = (f"signal {record['signal']}" if record["signal"]
                           else f"exit {record['exit_code']}")
    signalled = [t for t in firsts.values() if t is not None]
    every = len(signalled) == len(firsts)
    out.update({
        "failed_rank_ended_at": failed_end,
        "anchor_to_failed_rank_ended_at_s": None if failed_end is None else failed_end - anchor,
        "first_stop_signal_at": firsts,
        "others_died_of": died,
        "all_others_signalled": every,
        # the brief's measure: failing rank's ended_at -> latest first stop signal (envelope)
        "ended_at_to_every_rank_signalled_s": (max(signalled) - failed_end)
        if every and signalled and failed_end is not None else None,
        "anchor_to_every_rank_signalled_s": (max(signalled) - anchor)
        if every and signalled else None,
        "stop_record": envs[0].get("stop"),
        "envelope_exit_codes": [e["exit_code"] if e else None for e in envs],
    })
    return out


def check(case: str, which: str, row: dict[str, Any], slot: Path, world: int) -> None:
    """forgelm-tui misbehaving stops the bench, evidence kept; torchrun is only recorded."""
    problems = []
    if row["orphans"]["alive_after"]:
        problems.append(f"{row['orphans']['alive_after']} process(es) of the run alive "
                        f"{row['orphans']['after_s']:g} s after every launcher ended: "
                        f"{row['orphans']['who']}")
    if row["ranks_ready"] != world:
        problems.append(f"only {row['ranks_ready']} of {world} ranks got through "
                        "init_process_group")
    if which != T2:
        want = EXPECTED_FTUI[case]
        if any(rc != want for rc in row["rc"]):
            problems.append(f"exit codes {row['rc']}, expected {want} on every node")
        envs = row["envelopes"]
        if any(e is None for e in envs):
            problems.append("an envelope is missing")
        else:
            codes = [e["exit_code"] for e in envs]
            if any(c != want for c in codes):
                problems.append(f"envelope exit codes {codes}, expected {want}")
            if any(len(e["ranks"]) != world for e in envs):
                problems.append(f"envelope ranks {[len(e['ranks']) for e in envs]}, "
                                f"expected {world}")
            if which == F2 and any(len(e.get("nodes") or []) != 2 for e in envs):
                problems.append("an envelope does not list both nodes")
        if case == "fail" and which == F2 and not row.get("all_others_signalled"):
            row.setdefault("notes", []).append(
                "a rank ended before it was signalled: " + json.dumps(row.get("others_died_of")))
    if problems and which != T2:
        raise BenchError(f"{which}, case {case}: " + "; ".join(problems) + f"; see {slot}")
    if problems:
        row["problems"] = problems


# ------------------------------------------------------------------------- the cases


def import_floor(ctx: Ctx, rep: int) -> dict[str, Any]:
    """What a process pays for importing torch.distributed (the control store's TCPStore):
    a plain python doing only that, measured as the launchers are."""
    load = quiet(ctx.quiet_cpus, ctx.quiet_run_wait)
    slot = ctx.slot("ok", "import-floor", rep)
    group = Group([[base.PYTHON, "-c", "import torch.distributed, time; time.sleep(0.3)"]],
                  slot, ctx.env)
    group.wait(120)
    node = group.nodes[0]
    return {"slot": str(slot.relative_to(ctx.out)), "load_before": load, "rc": [node.rc],
            "nodes": [node.record()], "wall_s": (node.ended_mono or 0) - node.started}


def run_case(ctx: Ctx, case: str, launchers: Sequence[str], reps: int,
             rows: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    """``reps`` runs of each launcher, alternating (A B A B ...)."""
    per = rows.setdefault(case, {w: [] for w in launchers})
    for rep in range(reps):
        for which in launchers:
            row = run_once(ctx, case, which, rep)
            per[which].append(row)
            print(f"  {case:8s} {rep:2d} {which:20s} rc {row['rc']} {brief(row)}", flush=True)
        if case == "ok":
            row = import_floor(ctx, rep)
            per.setdefault(FLOOR, []).append(row)
            print(f"  {case:8s} {rep:2d} {FLOOR}: peak RSS "
                  f"{row['nodes'][0]['hwm_kib'] / 1024:.0f} MiB, CPU "
                  f"{row['nodes'][0]['own_cpu']:.2f} s", flush=True)


def brief(row: dict[str, Any]) -> str:
    parts = [f"busy before {row['load_before']['busy_cpus']:.1f}", f"wall {row['wall_s']:.2f}s"]
    if "to_every_launcher_exited_s" in row:
        if row.get("ended_at_to_every_rank_signalled_s") is not None:
            signalled = row["ended_at_to_every_rank_signalled_s"] * 1e3
            anchored = row["anchor_to_every_rank_signalled_s"] * 1e3
            parts.append(f"fail->all signalled {signalled:.0f} ms (anchor {anchored:.0f} ms)")
        elif "others_died_of" in row:
            parts.append(f"not every rank signalled: {row['others_died_of']}")
        parts.append(f"fail->launchers exited "
                     f"{[round(x * 1e3) for x in row['to_launcher_exit_s']]} ms")
    else:
        parts.append("peak RSS " + "/".join(f"{n['hwm_kib'] / 1024:.0f}" for n in row["nodes"])
                     + " MiB, CPU " + "/".join(f"{n['own_cpu']:.2f}" for n in row["nodes"])
                     + " s")
    if row["orphans"]["at_end"]:
        parts.append(f"{row['orphans']['at_end']} process(es) alive at the end, "
                     f"{row['orphans']['alive_after']} after {row['orphans']['after_s']:g} s")
    return "; ".join(parts)


# ------------------------------------------------------------------------- summary


def stats(values: Sequence[float]) -> dict[str, Any] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def summarize(rows: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"codes": {}, "failure": {}, "resources": {}}
    for case, per in rows.items():
        for which, runs in per.items():
            if which == FLOOR:
                continue
            seen: dict[str, int] = {}
            for run in runs:
                key = " / ".join(str(rc) for rc in run["rc"])
                seen[key] = seen.get(key, 0) + 1
            out["codes"].setdefault(case, {})[which] = seen
    for which, runs in rows.get("fail", {}).items():
        s: dict[str, Any] = {
            "anchor_to_every_launcher_exited_s": stats(
                [r["to_every_launcher_exited_s"] for r in runs]),
            "anchor_to_node0_exit_s": stats([r["to_launcher_exit_s"][0] for r in runs]),
            "anchor_to_node1_exit_s": stats([r["to_launcher_exit_s"][1] for r in runs]),
            "anchor_to_gloo_error_s": stats(
                [t for r in runs for t in r["gloo_error_after_s"].values()]),
            "runs_with_gloo_error": sum(1 for r in runs if r["gloo_error_after_s"]),
            "busy_cpus_before_run": stats([r["load_before"]["busy_cpus"] for r in runs]),
            "runs": len(runs),
        }
        if which == F2:
            s.update({
                "ended_at_to_every_rank_signalled_s": stats(
                    [r["ended_at_to_every_rank_signalled_s"] for r in runs]),
                "anchor_to_every_rank_signalled_s": stats(
                    [r["anchor_to_every_rank_signalled_s"] for r in runs]),
                "anchor_to_failed_rank_ended_at_s": stats(
                    [r["anchor_to_failed_rank_ended_at_s"] for r in runs]),
                "last_rank_ended_at_to_node0_exit_s": stats(
                    [r["last_rank_ended_at_to_launcher_exit_s"][0] for r in runs]),
                "last_rank_ended_at_to_node1_exit_s": stats(
                    [r["last_rank_ended_at_to_launcher_exit_s"][1] for r in runs]),
                "runs_not_every_rank_signalled": sum(
                    1 for r in runs if not r["all_others_signalled"]),
                "others_died_of": _count(d for r in runs for d in r["others_died_of"].values()),
            })
        else:
            s["worker_exitcodes_reported_by_agents"] = _count(
                " / ".join(str(c) for c in codes) for r in runs
                for codes in [[x for node in r["torchrun_worker_exitcodes"] for x in node]])
        out["failure"][which] = s
    for which, runs in rows.get("ok", {}).items():
        nodes = len(runs[0]["nodes"]) if runs else 0
        res: dict[str, Any] = {"wall_s": stats([r["wall_s"] for r in runs])}
        for i in range(nodes):
            res[f"node{i}"] = {
                "vmhwm_mib": stats([r["nodes"][i]["hwm_kib"] / 1024 for r in runs]),
                "vmrss_sampled_max_mib": stats([r["nodes"][i]["peak_rss_kib"] / 1024
                                                for r in runs]),
                "own_cpu_s": stats([r["nodes"][i]["own_cpu"] for r in runs]),
                "children_cpu_s": stats([r["nodes"][i]["children_cpu"] for r in runs]),
            }
        res["all_launcher_processes"] = {
            "vmhwm_mib": stats([sum(n["hwm_kib"] for n in r["nodes"]) / 1024 for r in runs]),
            "own_cpu_s": stats([sum(n["own_cpu"] for n in r["nodes"]) for r in runs]),
        }
        out["resources"][which] = res
    return out


def _count(items: Any) -> dict[str, int]:
    found: dict[str, int] = {}
    for item in items:
        found[item] = found.get(item, 0) + 1
    return found


def _ms(s: dict[str, Any] | None) -> str:
    if s is None:
        return "- | - | - | 0"
    return (f"{s['median'] * 1e3:.1f} | {s['max'] * 1e3:.1f} | {s['min'] * 1e3:.1f} | {s['n']}")


def _v(s: dict[str, Any] | None, digits: int = 1) -> str:
    if s is None:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def tables(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    k = meta["nproc_per_node"]
    source = meta.get("forgelm_tui_source", "working tree")
    out = [f"forgelm-tui measured from: {source}; HEAD {meta['commit']} at the start, "
           f"{meta.get('commit_at_end', '?')} at the end.\n",
           f"### Exit codes (node 0 / node 1; {k} rank(s) per node; runs with that pair)\n",
           "| case | " + " | ".join((F2, T2, F1)) + " |", "|---|---|---|---|"]
    what = {"ok": "every rank exits 0 (after ~5 s of all_reduce)",
            "approval": "every rank: barrier, then exit 4",
            "rank0": "barrier, then rank 0 exits 4, the others 0",
            "fail": f"rank {k} (node 1) exits 2 mid-loop"}
    for case, per in summary["codes"].items():
        cells = []
        for which in (F2, T2, F1):
            seen = per.get(which)
            cells.append(", ".join(f"{key} (x{n})" for key, n in seen.items()) if seen else "-")
        out.append(f"| {case}: {what[case]} | " + " | ".join(cells) + " |")
    fail = summary["failure"]
    if fail:
        out += ["", "### Remote rank failure (ms; same machine, one clock)\n",
                "| measure | launcher | median | max | min | n |", "|---|---|---|---|---|---|"]
        rows = [
            ("failing rank's `ended_at` -> latest first stop signal `at` on the other ranks "
             "(envelope, ms resolution)", F2, "ended_at_to_every_rank_signalled_s"),
            ("failure anchor (rank's time.time() before os._exit) -> latest first stop "
             "signal `at`", F2, "anchor_to_every_rank_signalled_s"),
            ("failure anchor -> failing rank's `ended_at` (its own exit + the supervisor "
             "seeing it)", F2, "anchor_to_failed_rank_ended_at_s"),
            ("failure anchor -> the surviving ranks' gloo error", F2, "anchor_to_gloo_error_s"),
            ("failure anchor -> the surviving ranks' gloo error", T2, "anchor_to_gloo_error_s"),
            ("failure anchor -> node 1 (failing node) launcher exited", F2,
             "anchor_to_node1_exit_s"),
            ("failure anchor -> node 1 (failing node) launcher exited", T2,
             "anchor_to_node1_exit_s"),
            ("failure anchor -> node 0 launcher exited", F2, "anchor_to_node0_exit_s"),
            ("failure anchor -> node 0 launcher exited", T2, "anchor_to_node0_exit_s"),
            ("last rank's `ended_at` (envelope) -> node 1 supervisor exited", F2,
             "last_rank_ended_at_to_node1_exit_s"),
            ("last rank's `ended_at` (envelope) -> node 0 supervisor exited", F2,
             "last_rank_ended_at_to_node0_exit_s"),
            ("failure anchor -> every launcher exited", F2, "anchor_to_every_launcher_exited_s"),
            ("failure anchor -> every launcher exited", T2, "anchor_to_every_launcher_exited_s"),
        ]
        for label, which, key in rows:
            if which in fail:
                out.append(f"| {label} | {which} | {_ms(fail[which].get(key))} |")
        busy = {w: fail[w]["busy_cpus_before_run"] for w in (F2, T2) if w in fail}
        out.append("\nCPUs busy with other work in the 0.5 s before each run (median, max): "
                   + "; ".join(f"{w} {s['median']:.2f}, {s['max']:.2f}"
                               for w, s in busy.items() if s) + ".")
        if F2 in fail:
            f = fail[F2]
            out.append(f"\n{F2}: the other ranks died of {f['others_died_of']}; runs where a "
                       f"rank ended before it was signalled: "
                       f"{f['runs_not_every_rank_signalled']} of {f['runs']}.")
        if T2 in fail:
            f = fail[T2]
            out.append(f"{T2}: worker exit codes in the agents' error reports (node 0 / node 1):"
                       f" {f['worker_exitcodes_reported_by_agents']}; runs where a surviving "
                       f"rank recorded a gloo error: {f['runs_with_gloo_error']} of {f['runs']}.")
    res = summary["resources"]
    if res:
        out += ["", "### Launcher processes, every rank looping ~5 s (median, min-max)\n",
                "| launcher | process | peak RSS (VmHWM), MiB | max sampled VmRSS, MiB | "
                "CPU user+sys, s | its reaped children's CPU, s |", "|---|---|---|---|---|---|"]
        for which in (F2, F1, T2, FLOOR):
            if which not in res:
                continue
            r = res[which]
            if which == FLOOR:
                n = r["node0"]
                out.append(f"| {which} (and sleep 0.3 s) | python | {_v(n['vmhwm_mib'])} | "
                           f"{_v(n['vmrss_sampled_max_mib'])} | {_v(n['own_cpu_s'], 2)} | - |")
                continue
            for key in sorted(k for k in r if k.startswith("node")):
                n = r[key]
                label = ("supervisor" if which != T2 else "agent") + (
                    f" node {key[4:]}" if which != F1 else f" ({2 * k} ranks)")
                out.append(f"| {which} | {label} | {_v(n['vmhwm_mib'])} | "
                           f"{_v(n['vmrss_sampled_max_mib'])} | {_v(n['own_cpu_s'], 2)} | "
                           f"{_v(n['children_cpu_s'], 2)} |")
            if which != F1:
                a = r["all_launcher_processes"]
                out.append(f"| {which} | both together | {_v(a['vmhwm_mib'])} | - | "
                           f"{_v(a['own_cpu_s'], 2)} | - |")
        out.append("\nwall from the first launch to the last launcher's end, s: " + "; ".join(
            f"{w} {_v(res[w]['wall_s'], 2)}" for w in (F2, F1, T2) if w in res))
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------- main


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                          text=True).stdout.strip()


def diff_digest() -> str:
    """A digest of the uncommitted changes to forgelm_tui/ (the editable install runs them):
    taken at the start and the end, it shows whether the code changed under the bench."""
    return hashlib.sha1(git("diff", "HEAD", "--", "forgelm_tui").encode()).hexdigest()[:12]


def meta(args: argparse.Namespace) -> dict[str, Any]:
    def version(code: str) -> str:
        out = subprocess.run([base.PYTHON, "-c", code], capture_output=True, text=True,
                             timeout=120)
        return out.stdout.strip() or out.stderr.strip().splitlines()[-1]

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "forgelm_tui_modified": git("status", "--porcelain", "forgelm_tui").splitlines(),
        "forgelm_tui_diff_sha1": diff_digest(),
        "forgelm_tui_source": "working tree (editable install)",
        "measured_commit": None,  # set by --at-commit; else see each run's forgelm_tui_commit
        "cpus": os.cpu_count(),
        "kernel": os.uname().release,
        "torch": version("import torch; print(torch.__version__)"),
        "forgelm_tui": version("import forgelm_tui; print(forgelm_tui.__version__)"),
        "torchrun_monitor_interval_default_s": base.torch_default_monitor_interval(),
        "nproc_per_node": args.nproc_per_node,
        "runs": args.runs,
        "resource_reps": args.resource_reps,
        "code_reps": args.code_reps,
        "quick": args.quick,
        "rss_sample_period_s": SAMPLE_S,
        "quiet_cpus": args.quiet_cpus,
        "quiet_wait_s": args.quiet_wait,
        "quiet_run_wait_s": args.quiet_run_wait,
    }


def warm_up(ctx: Ctx) -> None:
    """One untimed run per launcher (page cache, torch's import), not counted."""
    for which in (F2, T2, F1):
        run_once(ctx, "approval", which, 99)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=None,
                        help="failure runs per launcher (default 20; 3 with --quick)")
    parser.add_argument("--resource-reps", type=int, default=None,
                        help="~5 s runs per launcher for CPU / RSS and exit 0 (4; 1 quick)")
    parser.add_argument("--code-reps", type=int, default=None,
                        help="runs per launcher of the exit-4 cases (3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="few runs: about 2 minutes")
    parser.add_argument("--only", default="ok,approval,rank0,fail",
                        help="cases to run, e.g. fail or ok,fail")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="ranks per node (1)")
    parser.add_argument("--quiet-cpus", type=float, default=0.5,
                        help="before each case wait for fewer CPUs than this busy (0.5)")
    parser.add_argument("--quiet-wait", type=float, default=None,
                        help="... but for at most this many seconds, then go on (30; 5 quick)")
    parser.add_argument("--quiet-run-wait", type=float, default=None,
                        help="the same before every run, at most this long (2; 0 quick)")
    parser.add_argument("--at-commit", default=None, metavar="REV",
                        help="run forgelm-tui from git archive REV instead of the working tree "
                             "(e.g. HEAD: other sessions' commits then cannot change the code "
                             "measured halfway)")
    parser.add_argument("--out", type=Path, default=None,
                        help="launcher output and run dirs (default bench/out/multinode-TIME)")
    parser.add_argument("--json", type=Path, default=None,
                        help="raw results (default bench/multinode.json; the out dir with "
                             "--quick)")
    args = parser.parse_args(argv)
    args.runs = args.runs or (3 if args.quick else 20)
    args.resource_reps = args.resource_reps or (1 if args.quick else 4)
    args.code_reps = args.code_reps or (1 if args.quick else 3)
    if args.quiet_wait is None:
        args.quiet_wait = 5.0 if args.quick else 30.0
    if args.quiet_run_wait is None:
        args.quiet_run_wait = 0.0 if args.quick else 2.0
    out = (args.out or BENCH / "out" / time.strftime("multinode-%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or (out / "multinode.json" if args.quick else BENCH / "multinode.json")

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    results: dict[str, Any] = {"meta": meta(args), "load_before": {}, "runs": {}}
    ctx = Ctx(out, args.nproc_per_node)
    ctx.quiet_cpus, ctx.quiet_run_wait = args.quiet_cpus, args.quiet_run_wait
    if args.at_commit:
        results["meta"]["forgelm_tui_source"] = (
            f"git archive {ctx.pin(args.at_commit)} (python -m forgelm_tui, PYTHONPATH)")
        results["meta"]["measured_commit"] = ctx.pinned
    print(f"multinode: out {out}; {args.runs} failure runs, {args.resource_reps} resource runs, "
          f"{args.code_reps} per exit-4 case; {args.nproc_per_node} rank(s) per node",
          flush=True)
    started = time.monotonic()
    plan = [("ok", (F2, F1, T2), args.resource_reps),
            ("approval", (F2, T2), args.code_reps),
            ("rank0", (F2, T2), args.code_reps),
            ("fail", (F2, T2), args.runs)]
    error: str | None = None
    try:
        warm_up(ctx)
        for case, launchers, reps in plan:
            if case not in args.only.split(","):
                continue
            load = base.wait_quiet(args.quiet_cpus, args.quiet_wait)
            results["load_before"][case] = load
            print(f"  load before {case}: {load['busy_cpus']} of {os.cpu_count()} CPUs busy "
                  f"(loadavg {load['loadavg'][0]})", flush=True)
            run_case(ctx, case, launchers, reps, results["runs"])
    except BenchError as exc:
        error = str(exc)
        print(f"multinode: STOPPED: {error}", file=sys.stderr, flush=True)
    finally:
        killed = base.kill_leftovers()
        if killed:
            print(f"multinode: killed {killed} leftover process(es)", file=sys.stderr)
    results["meta"]["example_argv"] = EXAMPLE_ARGV
    results["meta"]["commit_at_end"] = git("rev-parse", "--short", "HEAD")
    results["meta"]["forgelm_tui_diff_sha1_at_end"] = diff_digest()
    results["meta"]["bench_seconds"] = round(time.monotonic() - started, 1)
    results["error"] = error
    results["summary"] = summarize(results["runs"])
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    text = tables(results["summary"], results["meta"])
    (out / "tables.md").write_text(text)
    print("\n" + text)
    print(f"multinode: {results['meta']['bench_seconds']} s; raw numbers in {json_path}; "
          f"tables in {out / 'tables.md'}")
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
