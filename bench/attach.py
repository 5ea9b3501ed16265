"""forgelm-tui attach (issue 11, point 6): the first frame, and what viewers cost a run.

    /work/main/.venv/bin/python bench/attach.py [--quick] [--runs N] [--only frame,flood]
    /work/main/.venv/bin/python bench/attach.py --tables-from bench/attach.json

frame  `python -m forgelm_tui attach RUN_DIR` started in tmux while a `--no-tui` run of 2 (and 8)
       sleeping ranks is going -> the first capture-pane that shows the rank table with every
       rank's pid. Goal <= 1 s. Interleaved with the Textual floor of bench/tui.py (a Textual
       app with one DataTable). After each frame the viewer is detached with `d` (the time to
       its exit and the run still going are recorded).
flood  2 ranks x 200,000 lines of 100 B, `--no-tui --run-dir D`, stdout to /dev/null, with
       0 viewers / 2 attach TUIs in tmux / 2 raw protocol viewers (ControlClient, reading as
       fast as they can, in subprocesses) / 1 stuck viewer (connects, never reads), interleaved
       A B C D A B C D. Two variants:
         socket  as the issue's bench asks: viewers started as soon as control.sock exists,
                 ranks = bench/ranks/flood.py; ranks' wall = envelope, first started_at -> last
                 ended_at. The flood is ~0.5 s, shorter than an attach TUI's start, so the
                 bench records when each viewer was actually connected.
         gated   the ranks (bench/ranks/gated_flood.py) block on a FIFO until every viewer is
                 connected (and the TUIs show their table) plus 0.5 s; ranks' wall = gate
                 opened (bench) -> the last rank's last flush (rank), both CLOCK_MONOTONIC;
                 also the envelope's last ended_at. So the viewers are attached for the whole
                 flood.
       Wall-clock figures (the envelope's stamps) are left out of medians when the VM's wall
       clock moved more than 0.1 s against CLOCK_MONOTONIC during the run (seen once: 30 s).
       Ratio against 0 viewers (goal <= 1.25x on 2 cores); lines in rank-N.stdout.log (every
       byte compared with what the rank wrote); the supervisor's peak RSS (VmHWM sampled every
       20 ms) and CPU (its zombie's utime+stime); viewer connections seen in /proc/net/unix
       (accepted sockets on the control socket's path), so a dropped viewer shows; after the
       run, how long each attach TUI takes to show the verdict (FINISHED), up to 8 s.

Everything started here is killed at the end (tmux servers with kill-server, then SIGKILL to
anything that was under them; supervisors, ranks and raw viewers by pid + start time), also
on failure or Ctrl+C. No timing asserts: numbers and a pass/MISS list. Raw numbers in
bench/attach.json (the out dir with --quick); tables in OUT/tables.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import run as suite  # bench/run.py: processes, load probes
import tui as tb  # bench/tui.py: tmux servers, waiting, the Textual floor
from run import KNOWN, PYTHON, RANKS, BenchError, Proc, free_port

BENCH = Path(__file__).resolve().parent
FLOOD_LINES = 200_000
FLOOD_RANKS = 2
LINE_BYTES = 100
MODES = ("0 viewers", "2 attach TUIs", "2 raw viewers", "1 stuck viewer")
VARIANTS = ("socket", "gated")
SETTLE = 0.5  # gated: after every viewer is attached, before the gate opens (every mode)
SAMPLE = 0.020  # supervisor VmHWM and viewer connections
VERDICT_WAIT = 8.0  # s after the supervisor's exit for an attach TUI to show the verdict
CLOCK_STEP = 0.1  # s: a run whose wall clock moved this much against CLOCK_MONOTONIC is flagged
VIEWERS: list[subprocess.Popen[bytes]] = []  # raw viewer processes, killed at the end


# ------------------------------------------------------------------------- processes


def ftui(*args: str) -> list[str]:
    """The installed CLI, as the brief asks: ``python -m forgelm_tui``."""
    return [PYTHON, "-m", "forgelm_tui", *args]


class Headless(suite.Launch):
    """run.py's Launch (pidfd end, zombie's CPU, wait4), with stdout to /dev/null or a file."""

    def __init__(self, argv: Sequence[str], out: Path, *, cwd: Path, env: dict[str, str],
                 devnull: bool) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        self.argv = list(argv)
        self.out = out
        self._stdout = open(os.devnull if devnull else out.with_suffix(".stdout"), "wb")  # noqa: SIM115
        self._stderr = open(out.with_suffix(".stderr"), "wb")  # noqa: SIM115
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._stdout,
                                     stderr=self._stderr, cwd=cwd, env=env,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.pidfd = os.pidfd_open(self.pid)
        self.me = Proc.of(self.pid)
        if self.me is not None:
            KNOWN.add(self.me)
        suite.LIVE_LAUNCHERS.append(self)


def headless(ctx: suite.Ctx, nproc: int, slot: Path, target: Sequence[str], *,
             devnull: bool) -> Headless:
    argv = ftui("--no-tui", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
                "--master-port", str(free_port()), "--run-dir", str(slot / "run"), *target)
    return Headless(argv, slot / "launcher", cwd=slot, env=ctx.env, devnull=devnull)


def remember_tree(pid: int) -> None:
    tb.remember_tree(pid)


def close_all() -> int:
    for viewer in list(VIEWERS):
        with contextlib.suppress(Exception):
            if viewer.poll() is None:
                viewer.kill()
            viewer.wait(5)
        VIEWERS.remove(viewer)
    return tb.close_all()


def connections(sock: Path) -> int:
    """Accepted connections on the control socket: /proc/net/unix lists them with its path
    and state 03 (connected); the listening socket is state 01, the viewers' ends unnamed."""
    count = 0
    suffix = " " + str(sock)
    with contextlib.suppress(OSError), open("/proc/net/unix") as handle:
        for line in handle:
            if line.endswith(suffix + "\n"):
                fields = line.split()
                if len(fields) >= 8 and fields[5] == "03":
                    count += 1
    return count


class Sampler(threading.Thread):
    """Every 20 ms: the supervisor's VmHWM, and how many viewers its control socket holds."""

    def __init__(self, pid: int, sock: Path) -> None:
        super().__init__(daemon=True, name="attach-bench-sampler")
        self.pid, self.sock = pid, sock
        self.peak_kib = 0
        self.timeline: list[tuple[float, int]] = []  # (time.monotonic(), connections)
        self.halt = threading.Event()

    def run(self) -> None:
        last = -1
        while not self.halt.is_set():
            hwm = suite.vm_kib(self.pid, "VmHWM")
            if hwm is None:
                break
            self.peak_kib = max(self.peak_kib, hwm)
            conns = connections(self.sock)
            if conns != last:
                self.timeline.append((time.monotonic(), conns))
                last = conns
            self.halt.wait(SAMPLE)

    def now(self) -> int:
        return self.timeline[-1][1] if self.timeline else 0

    def first_at(self, count: int) -> float | None:
        return next((t for t, n in self.timeline if n >= count), None)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)


# ------------------------------------------------------------------------- raw viewer


def raw_viewer(sock: str, out: str) -> int:
    """A protocol viewer reading as fast as it can: ControlClient.next_item() in a loop (every
    event decoded, as the attach TUI's reader thread does). Writes its counts to OUT (json)."""
    t_start = time.time()
    from forgelm_tui.control.client import ControlClient, ControlError
    from forgelm_tui.engine import events as ev

    stats: dict[str, Any] = {"started": t_start, "events": 0, "snapshots": 0, "lines_seen": 0,
                             "output_events": 0, "verdict": False, "closed_early": None}
    try:
        client = ControlClient(sock, timeout=120)
    except ControlError as exc:  # started after the run was over
        stats["closed_early"] = f"connect: {exc}"
        Path(out).write_text(json.dumps(stats))
        return 0
    stats["connected"] = time.time()
    first = client.next_item()
    stats["snapshots"] += isinstance(first, ev.RunSnapshot)
    Path(out + ".ready").write_text(str(time.time()))
    try:
        while True:
            item = client.next_item()
            if isinstance(item, ev.RunSnapshot):
                stats["snapshots"] += 1  # it fell behind and was resynchronised
            elif isinstance(item, ev.RankOutput):
                stats["output_events"] += 1
                stats["lines_seen"] += item.raw.count(b"\n") + 1 if item.raw else 0
                stats["events"] += 1
            elif isinstance(item, ev.VerdictReached):
                stats["verdict"] = True
                stats["events"] += 1
                break
            elif not isinstance(item, dict):
                stats["events"] += 1
    except ControlError as exc:
        stats["closed_early"] = str(exc)
    stats["ended"] = time.time()
    client.close()
    Path(out).write_text(json.dumps(stats))
    return 0


# ------------------------------------------------------------------------- waiting


def wait_path(what: str, path: Path, timeout: float, period: float = 0.002) -> float:
    """Wait for a path to exist; returns time.time() when it was seen."""
    tb.wait_for(what, path.exists, timeout, period)
    return time.time()


def pane_status(tmux: tb.Tmux, name: str) -> str:
    return tmux.cmd("display-message", "-p", "-t", name, "#{pane_dead} #{pane_dead_status}",
                    check=False).strip()


def rank_pids(slot: Path, nproc: int, timeout: float) -> dict[int, int]:
    ready = tb.wait_for(f"{nproc} ranks ready",
                        lambda: (r := tb.ready_ranks(slot, nproc)) and len(r) == nproc and r,
                        timeout)
    return {rank: pid for rank, (pid, _) in ready.items()}


def table_with_pids(screen: str, pids: dict[int, int]) -> bool:
    """The rank table header and, for every rank, a row "RANK LOCAL PID ..." with its pid."""
    if not re.search(r"^\s*rank\s+local\s+pid\s+state", screen, re.M):
        return False
    rows = {(int(m[1]), int(m[2])) for m in re.finditer(r"^\s*(\d+)\s+\d+\s+(\d+)\s", screen, re.M)}
    return all((rank, pid) in rows for rank, pid in pids.items())


def quit_viewers(tmux: tb.Tmux, procs: list[Proc | None], slot: Path, since: float,
                 wait: float = VERDICT_WAIT) -> list[dict[str, Any]]:
    """After the run: how long each attach TUI took to show the verdict (FINISHED) after the
    supervisor exited (``since``, monotonic), or that it still showed something else ``wait`` s
    later (its whole pane kept); then `q` (SIGTERM, then SIGKILL, if it stays)."""
    names = [f"v{i}" for i in range(len(procs))]
    shown: dict[str, float | None] = dict.fromkeys(names)
    deadline = since + wait
    while True:
        for name in names:
            if shown[name] is None:
                screen = tmux.capture(name)
                if "FINISHED" in screen or pane_status(tmux, name).startswith("1"):
                    shown[name] = time.monotonic() - since
                    (slot / f"screen-end-{name}.txt").write_text(history(tmux, name))
        if all(v is not None for v in shown.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    found = []
    for name, proc in zip(names, procs, strict=True):
        screen = tmux.capture(name)
        if shown[name] is None:
            (slot / f"screen-end-{name}.txt").write_text(history(tmux, name))
        header = next((line.strip() for line in screen.splitlines() if "forgelm-tui" in line), "")
        tmux.keys(name, "q")
        ended = "q"
        if proc is not None and not tb.wait_gone(proc, 10):
            ended = "SIGTERM"
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            if not tb.wait_gone(proc, 10):
                ended = "SIGKILL"
                proc.kill()
        time.sleep(0.05)
        after_q = history(tmux, name)
        found.append({
            "verdict_shown_after_exit_s": shown[name] if "FINISHED" in screen else None,
            "found_run_over": "has ended" in after_q and "FINISHED" not in screen,
            "header_at_end": header[:160], "lost_the_run": "lost the run" in screen,
            "detached_message": "detached from run" in after_q,
            "error_line": next((line.strip() for line in after_q.splitlines()
                                if line.startswith("forgelm-tui attach:")), None),
            "ended_by": ended, "pane": pane_status(tmux, name)})
    return found


def history(tmux: tb.Tmux, name: str) -> str:
    return tmux.cmd("capture-pane", "-p", "-S", "-", "-t", name, check=False)


# ------------------------------------------------------------------------- frame


def attach_frame(ctx: suite.Ctx, rep: int, nproc: int, run: dict[str, Any]) -> dict[str, Any]:
    """`python -m forgelm_tui attach RUN_DIR` in a fresh tmux server -> every pid on screen."""
    slot = ctx.slot("attach-frame", f"n{nproc}", rep)
    tmux = tb.Tmux(tb.tui_env())
    try:
        t0 = tmux.start("v", ftui("attach", str(run["run_dir"])), slot)
        proc = Proc.of(tmux.pane_pid("v"))
        if proc is not None:
            KNOWN.add(proc)
        first_text = None
        polls = 0
        while True:
            before = time.perf_counter()
            screen = tmux.capture("v")
            after = time.perf_counter()
            polls += 1
            if first_text is None and screen.strip():
                first_text = after - t0
            if table_with_pids(screen, run["pids"]):
                break
            if after > t0 + 30:
                (slot / "screen-timeout.txt").write_text(screen)
                raise BenchError(f"frame: attach showed no rank table with the pids in 30 s; "
                                 f"see {slot}")
            time.sleep(max(0.0, before + tb.POLL - time.perf_counter()))
        (slot / "screen-first.txt").write_text(screen)
        result: dict[str, Any] = {"first_frame_s": after - t0, "capture_started_s": before - t0,
                                  "first_text_s": first_text, "polls": polls}
        # Detach: the viewer leaves, the run goes on.
        t_d = time.perf_counter()
        tmux.keys("v", "d")
        gone = proc is None or tb.wait_gone(proc, 20)
        result["detach_s"] = time.perf_counter() - t_d if gone else None
        result["pane_after_d"] = pane_status(tmux, "v")
        (slot / "screen-after-d.txt").write_text(tmux.capture("v"))
        result["run_alive_after_detach"] = run["launch"].me is not None and run["launch"].me.alive()
        if not gone and proc is not None:
            proc.kill()
        return result
    finally:
        tmux.close()


def scenario_frame(ctx: suite.Ctx, runs: int, sizes: Sequence[int]) -> dict[str, Any]:
    live: dict[int, dict[str, Any]] = {}
    try:
        for nproc in sizes:  # the sleeping runs, both going for the whole scenario
            slot = ctx.slot("attach-frame", f"run-n{nproc}", 0)
            target = [str(RANKS / "sleeper.py"), str(slot), "600"]
            launch = headless(ctx, nproc, slot, target, devnull=False)
            pids = rank_pids(slot, nproc, 60)
            wait_path("control.sock", slot / "run" / "control.sock", 30)
            remember_tree(launch.pid)
            live[nproc] = {"launch": launch, "pids": pids, "run_dir": slot / "run", "slot": slot}
        for nproc in sizes:  # one untimed attach each: page cache, .pyc
            attach_frame(ctx, 99, nproc, live[nproc])
        kinds = [f"attach {n} ranks" for n in sizes] + ["textual floor"]
        results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for rep in range(runs):
            for nproc in sizes:
                results[f"attach {nproc} ranks"].append(attach_frame(ctx, rep, nproc, live[nproc]))
            results["textual floor"].append(tb.frame_run(ctx, "textual floor", rep, 0))
            print(f"  frame rep {rep}: " + ", ".join(
                f"{k} {results[k][-1]['first_frame_s'] * 1000:.0f} ms" for k in kinds)
                + " (detach " + ", ".join(
                    f"{results[f'attach {n} ranks'][-1]['detach_s'] or float('nan'):.2f} s"
                    for n in sizes) + ")", flush=True)
        ends: dict[str, Any] = {}
        for nproc, run in live.items():  # a stop from outside; every rank must be gone after
            with contextlib.suppress(ProcessLookupError):
                os.kill(run["launch"].pid, signal.SIGTERM)
            done = run["launch"].wait(60)
            left = [p for p in map(Proc.of, run["pids"].values()) if p and p.alive()]
            ends[str(nproc)] = {"rc": done.rc, "ranks_alive_after": len(left),
                                "viewer_commands_in_envelope": sum(
                                    1 for c in (tb.envelope(run["run_dir"]) or {}).get(
                                        "cancel_requests") or [] if c.get("source") == "viewer")}
        return {"sizes": list(sizes), "poll_s": tb.POLL, "runs": results, "sleeping_runs": ends}
    finally:
        for run in live.values():
            run["launch"].kill()


# ------------------------------------------------------------------------- flood


def expected_log(rank: int) -> bytes:
    pad = "x" * 79
    return "".join(f"r{rank:03d} line {i:09d} {pad}\n" for i in range(FLOOD_LINES)).encode()


EXPECTED: dict[int, bytes] = {}


def check_logs(run_dir: Path) -> dict[str, Any]:
    """Newlines in each rank-N.stdout.log, and whether the file is byte for byte what the rank
    wrote; whole files are deleted (20 MB each), others kept as evidence."""
    per_rank: dict[str, Any] = {}
    lost = 0
    whole = True
    for rank in range(FLOOD_RANKS):
        path = run_dir / f"rank-{rank}.stdout.log"
        data = path.read_bytes() if path.exists() else b""
        want = EXPECTED.setdefault(rank, expected_log(rank))
        same = data == want
        lines = data.count(b"\n")
        lost += max(0, FLOOD_LINES - lines)
        entry: dict[str, Any] = {"lines": lines, "bytes": len(data), "identical": same}
        if not same:
            whole = False
            cut = next((i for i, (a, b) in enumerate(zip(data, want, strict=False)) if a != b),
                       min(len(data), len(want)))
            entry["first_difference_at_byte"] = cut
        per_rank[str(rank)] = entry
    if whole:
        for rank in range(FLOOD_RANKS):
            (run_dir / f"rank-{rank}.stdout.log").unlink(missing_ok=True)
    return {"expected_per_rank": FLOOD_LINES, "lost": lost, "identical": whole,
            "per_rank": per_rank}


def stamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def clock_offset() -> float:
    """time.time() - time.monotonic(): moves when the VM's wall clock is stepped."""
    return time.time() - time.monotonic()


def wait_child(popen: subprocess.Popen[bytes], timeout: float) -> tuple[int | None, float]:
    """Exit code and user+sys CPU (wait4's rusage) of a child; SIGKILL after ``timeout``."""
    proc = Proc.of(popen.pid)
    if proc is not None and not tb.wait_gone(proc, timeout):
        popen.kill()
    try:
        _, status, usage = os.wait4(popen.pid, 0)
    except ChildProcessError:
        return popen.returncode, float("nan")
    popen.returncode = os.waitstatus_to_exitcode(status)
    return popen.returncode, usage.ru_utime + usage.ru_stime


def flood_run(ctx: suite.Ctx, variant: str, mode: str, rep: int) -> dict[str, Any]:
    slot = ctx.slot("attach-flood", f"{variant}-{mode.replace(' ', '-')}", rep)
    run_dir = slot / "run"
    sock = run_dir / "control.sock"
    gated = variant == "gated"
    tmux: tb.Tmux | None = None
    launch: Headless | None = None
    sampler: Sampler | None = None
    gate_fd: int | None = None
    stuck: socket.socket | None = None
    raws: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {"variant": variant, "mode": mode}
    wanted = {"0 viewers": 0, "2 attach TUIs": 2, "2 raw viewers": 2, "1 stuck viewer": 1}[mode]
    try:
        if mode == "2 attach TUIs":
            tmux = tb.Tmux(tb.tui_env())  # the server starts before the run, as in tui.py
        if gated:
            os.mkfifo(slot / "gate")
            gate_fd = os.open(slot / "gate", os.O_RDWR)
            target = [str(RANKS / "gated_flood.py"), str(slot / "gate"), str(FLOOD_LINES),
                      str(slot)]
        else:
            target = [str(RANKS / "flood.py"), str(FLOOD_LINES)]
        offset0 = clock_offset()
        launch = headless(ctx, FLOOD_RANKS, slot, target, devnull=True)
        sampler = Sampler(launch.pid, sock)
        sampler.start()
        wait_path("control.sock", sock, 30)
        t_sock = time.monotonic()
        remember_tree(launch.pid)
        tui_procs: list[Proc | None] = []
        if mode == "2 attach TUIs":
            assert tmux is not None
            for i in range(2):
                tmux.start(f"v{i}", ftui("attach", str(run_dir)), slot)
                proc = Proc.of(tmux.pane_pid(f"v{i}"))
                tui_procs.append(proc)
                if proc is not None:
                    KNOWN.add(proc)
        elif mode == "2 raw viewers":
            for i in range(2):
                viewer = subprocess.Popen(
                    [PYTHON, str(Path(__file__).resolve()), "--raw-viewer", str(sock),
                     str(slot / f"raw-{i}.json")], cwd=slot, env=ctx.env,
                    stdout=open(slot / f"raw-{i}.out", "wb"),  # noqa: SIM115
                    stderr=subprocess.STDOUT, start_new_session=True)
                raws.append(viewer)
                VIEWERS.append(viewer)
                proc = Proc.of(viewer.pid)
                if proc is not None:
                    KNOWN.add(proc)
        elif mode == "1 stuck viewer":
            stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # and never a recv: the run's writes pile up. The socket file exists from its bind,
            # a moment before the server listens: refused until then.
            tb.wait_for("the stuck viewer's connection",
                        lambda: stuck is not None and stuck.connect_ex(str(sock)) == 0, 30, 0.005)
        t_gate = None
        if gated:
            tb.wait_for("ranks at the gate", lambda: all(
                (slot / f"waiting-{r}").exists() for r in range(FLOOD_RANKS)), 60, 0.005)
            tb.wait_for(f"{wanted} viewer connection(s)", lambda: sampler.now() >= wanted, 60,
                        0.005)
            if mode == "2 attach TUIs":
                assert tmux is not None
                tb.wait_for("both viewers' rank tables", lambda: all(
                    tb.shows_table(tmux.capture(f"v{i}")) for i in range(2)), 60, 0.05)
            elif mode == "2 raw viewers":
                tb.wait_for("raw viewers' snapshots", lambda: all(
                    (slot / f"raw-{i}.json.ready").exists() for i in range(2)), 60, 0.005)
            time.sleep(SETTLE)
            t_gate, t_gate_wall = time.monotonic(), time.time()
            assert gate_fd is not None
            os.write(gate_fd, b"g" * FLOOD_RANKS)
        done = launch.wait(300)
        sup_end = launch.t0 + done.wall  # perf_counter is CLOCK_MONOTONIC on Linux
        sampler.stop()
        offset1 = clock_offset()
        suite.check_rc(mode, done, {0}, slot)
        env = tb.envelope(run_dir)
        if env is None:
            raise BenchError(f"flood: no envelope in {run_dir}")
        if env["exit_code"] != 0:
            raise BenchError(f"flood: {mode} run ended with {env['exit_code']}; see {slot}")
        starts = [stamp(r["started_at"]) for r in env["ranks"]]
        ends = [stamp(r["ended_at"]) for r in env["ranks"]]
        step = offset1 - offset0  # the wall clock's drift is ~0.5% here; a step is seconds
        result.update({
            "clock_step_s": step, "clock_stepped": abs(step) > CLOCK_STEP,
            "envelope_ranks_wall_s": tb.ranks_wall(env),
            "supervisor_wall_s": done.wall, "supervisor_cpu_s": done.own_cpu,
            "supervisor_peak_rss_kib": sampler.peak_kib,
            # wall-clock stamps of the envelope on the monotonic clock, with the offset at the end
            "last_rank_end_to_supervisor_exit_s": sup_end - (max(ends) - offset1),
        })
        if gated:
            assert t_gate is not None
            own = [tuple(map(float, (slot / f"flood-{r}").read_text().split()))
                   for r in range(FLOOD_RANKS)]
            result.update({
                # gate (bench, CLOCK_MONOTONIC) -> the last rank's last flush (rank, same clock)
                "ranks_wall_s": max(o[1] for o in own) - t_gate,
                "ranks_own_wall_s": max(o[1] for o in own) - min(o[0] for o in own),
                "gate_to_first_line_s": min(o[0] for o in own) - t_gate,
                "gate_to_last_ended_at_s": max(ends) - t_gate_wall,  # the envelope's clock
                "gate_to_supervisor_exit_s": sup_end - t_gate,
            })
            flood_from = t_gate
        else:
            result["ranks_wall_s"] = result["envelope_ranks_wall_s"]
            flood_from = min(starts) - offset1
            result["socket_after_first_start_s"] = t_sock - flood_from
        flood_to = max(ends) - offset1
        all_at = sampler.first_at(wanted) if wanted else None
        drops = sum(m - n for (t, n), (_, m) in zip(sampler.timeline[1:], sampler.timeline,
                                                     strict=False) if n < m and t < flood_to)
        result["viewers"] = {
            "wanted": wanted,
            "all_connected_after_flood_start_s": None if all_at is None else all_at - flood_from,
            "flood_length_s": flood_to - flood_from,
            "max_connected": max((n for _, n in sampler.timeline), default=0),
            "connected_at_end": sampler.now(),
            # connections the supervisor closed while a rank was still running: dropped viewers
            "dropped_before_ranks_ended": drops,
            "timeline": [(round(t - flood_from, 3), n) for t, n in sampler.timeline],
        }
        result["lines"] = check_logs(run_dir)
        if mode == "2 attach TUIs":
            assert tmux is not None
            cpus = [tb.ticks(p.pid) if p is not None else None for p in tui_procs]
            result["tuis"] = quit_viewers(tmux, tui_procs, slot, sup_end)
            for info, cpu in zip(result["tuis"], cpus, strict=True):
                info["cpu_s_at_run_end"] = None if cpu is None else cpu / suite.CLK_TCK
            result["tmux_server_cpu_s"] = (tmux.cpu_ticks() or 0) / suite.CLK_TCK
        elif mode == "2 raw viewers":
            stats = []
            for i, viewer in enumerate(raws):
                rc, cpu = wait_child(viewer, 30)
                entry: dict[str, Any] = {"rc": rc, "cpu_s": cpu}
                with contextlib.suppress(OSError, ValueError):
                    entry.update(json.loads((slot / f"raw-{i}.json").read_text()))
                for key in ("started", "connected", "ended"):
                    if key in entry:
                        entry[key] = round(entry[key] - offset1 - flood_from, 3)
                stats.append(entry)
            result["raw"] = stats
        elif mode == "1 stuck viewer":
            assert stuck is not None
            stuck.setblocking(False)
            got = 0
            with contextlib.suppress(BlockingIOError, OSError):
                while chunk := stuck.recv(1 << 20):
                    got += len(chunk)
            result["stuck_bytes_waiting_at_end"] = got
        return result
    finally:
        if sampler is not None:
            sampler.stop()
        if stuck is not None:
            stuck.close()
        if gate_fd is not None:
            os.close(gate_fd)
        for viewer in raws:
            if viewer.returncode is None:
                viewer.kill()
                with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                    viewer.wait(5)
            if viewer in VIEWERS:
                VIEWERS.remove(viewer)
        if tmux is not None:
            tmux.close()
        if launch is not None:
            launch.kill()


def scenario_flood(ctx: suite.Ctx, runs: int, variants: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"ranks": FLOOD_RANKS, "lines_per_rank": FLOOD_LINES,
                           "line_bytes": LINE_BYTES, "settle_s": SETTLE, "variants": {}}
    for variant in variants:
        out["variants"][variant] = {m: [] for m in MODES}
    for rep in range(runs):
        for variant in variants:
            for mode in MODES:  # A B C D A B C D ...
                r = flood_run(ctx, variant, mode, rep)
                out["variants"][variant][mode].append(r)
                v = r["viewers"]
                conn = ("" if not v["wanted"] else
                        f", viewers all in at {fmt_s(v['all_connected_after_flood_start_s'])}"
                        f" of {v['flood_length_s']:.2f} s")
                print(f"  flood {variant} rep {rep} {mode}: ranks wall {r['ranks_wall_s']:.3f} s"
                      f", supervisor CPU {r['supervisor_cpu_s']:.2f} s, peak "
                      f"{r['supervisor_peak_rss_kib'] / 1024:.1f} MiB, lost "
                      f"{r['lines']['lost']}{'' if r['lines']['identical'] else ' NOT IDENTICAL'}"
                      f"{conn}", flush=True)
    return out


def fmt_s(value: float | None) -> str:
    return "never" if value is None else f"{value:+.2f} s"


# ------------------------------------------------------------------------- reporting


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def steady(runs: list[dict[str, Any]], key: str) -> list[float]:
    """The values of runs whose wall clock was not stepped (only wall-clock figures need it)."""
    return [r[key] for r in runs if not r.get("clock_stepped")]


def ref_wall(modes: dict[str, list[dict[str, Any]]]) -> float:
    return med(steady(modes["0 viewers"], "ranks_wall_s"))


def tables(results: dict[str, Any]) -> str:
    sc = results["scenarios"]
    out: list[str] = []
    if "frame" in sc:
        fr = sc["frame"]
        out.append("### attach: `python -m forgelm_tui attach RUN_DIR` in tmux -> first screen "
                   f"with the rank table and every rank's pid (ms; capture-pane every "
                   f"{fr['poll_s'] * 1000:.0f} ms)\n")
        out.append("| what | n | median | max | min | first non-empty screen, median | "
                   "`d` -> viewer exited, median s (max) | run still going after `d` |\n"
                   "|---|---|---|---|---|---|---|---|")
        for kind, runs in fr["runs"].items():
            frames = [r["first_frame_s"] * 1000 for r in runs]
            firsts = [r["first_text_s"] * 1000 for r in runs if r.get("first_text_s")]
            detach = [r["detach_s"] for r in runs if r.get("detach_s") is not None]
            alive = [r.get("run_alive_after_detach") for r in runs]
            going = "-" if kind == "textual floor" else f"{sum(map(bool, alive))}/{len(alive)}"
            label = ("floor: Textual app with one DataTable (bench/tui_floor_app.py)"
                     if kind == "textual floor" else
                     f"forgelm-tui attach, `--no-tui` run of {kind.removeprefix('attach ')}")
            out.append(f"| {label} | {len(frames)} | {med(frames):.0f} | {max(frames):.0f} | "
                       f"{min(frames):.0f} | {med(firsts):.0f} | "
                       f"{f'{med(detach):.2f} ({max(detach):.2f})' if detach else '-'} | "
                       f"{going} |")
        ends = fr.get("sleeping_runs", {})
        if ends:
            out.append("\nThe sleeping runs, stopped with SIGTERM at the end: " + "; ".join(
                f"{n} ranks: exit {e['rc']}, ranks alive after {e['ranks_alive_after']}, "
                f"commands from viewers in the envelope {e['viewer_commands_in_envelope']}"
                for n, e in ends.items()))
        out.append("")
    if "flood" in sc:
        fl = sc["flood"]
        for variant, modes in fl["variants"].items():
            if not modes["0 viewers"]:
                continue
            gated = variant == "gated"
            what = ("ranks gated until every viewer is attached, +0.5 s; ranks' wall = gate -> "
                    "the last rank's last flush, CLOCK_MONOTONIC" if gated else
                    "viewers started once control.sock exists; ranks' wall = envelope, first "
                    "started_at -> last ended_at, runs with a wall-clock step left out")
            out.append(f"### flood `{variant}`: {fl['ranks']} ranks x {fl['lines_per_rank']:,} "
                       f"lines of {fl['line_bytes']} B, `--no-tui`, stdout /dev/null ({what})\n")
            third = "gate -> supervisor exit, s" if gated else "supervisor wall, s"
            out.append(f"| viewers | n | ranks' wall median, s | min-max | ratio to 0 viewers | "
                       f"{third} | last ended_at -> supervisor exit, s | supervisor CPU, s | "
                       f"supervisor peak RSS (VmHWM) MiB, median (max) | lines lost per run | "
                       f"all viewers connected, s after the flood's start (median; flood "
                       f"length) |\n|---|---|---|---|---|---|---|---|---|---|---|")
            ref = ref_wall(modes)
            for mode, runs in modes.items():
                if not runs:
                    continue
                walls = steady(runs, "ranks_wall_s") if not gated else [
                    r["ranks_wall_s"] for r in runs]
                stepped = sum(1 for r in runs if r.get("clock_stepped"))
                rss = [r["supervisor_peak_rss_kib"] / 1024 for r in runs]
                ident = all(r["lines"]["identical"] for r in runs)
                conn = [r["viewers"]["all_connected_after_flood_start_s"] for r in runs]
                seen = [c for c in conn if c is not None]
                length = med([r["viewers"]["flood_length_s"] for r in runs])
                if mode == "0 viewers":
                    conn_txt = "-"
                elif seen:
                    conn_txt = (f"{med(seen):+.2f} ({length:.2f})"
                                + (f"; not all in {conn.count(None)} runs" if None in conn else ""))
                else:
                    conn_txt = f"never ({length:.2f})"
                sup = [r["gate_to_supervisor_exit_s" if gated else "supervisor_wall_s"]
                       for r in runs]
                tail = steady(runs, "last_rank_end_to_supervisor_exit_s")
                count = f"{len(walls)}" + (f" (+{stepped} stepped)" if stepped and not gated
                                           else "")
                out.append(f"| {mode} | {count} | {med(walls):.3f} | "
                           f"{min(walls):.3f}-{max(walls):.3f} | "
                           f"{med(walls) / ref:.2f}x | {med(sup):.2f} | {med(tail):.2f} | "
                           f"{med([r['supervisor_cpu_s'] for r in runs]):.2f} | "
                           f"{med(rss):.1f} ({max(rss):.1f}) | "
                           f"{[r['lines']['lost'] for r in runs]}"
                           f"{'' if ident else ' (a log differs!)'} | {conn_txt} |")
            if gated:
                own = {m: med([r["ranks_own_wall_s"] for r in v]) for m, v in modes.items() if v}
                env = {m: med(steady(v, "gate_to_last_ended_at_s")) for m, v in modes.items()
                       if v}
                o0, e0 = own["0 viewers"], env["0 viewers"]
                out.append("\nSame runs, other clocks (median s): the ranks' own first line -> "
                           "last flush: " + ", ".join(
                               f"{m} {w:.3f} ({w / o0:.2f}x)" for m, w in own.items())
                           + "; gate -> the envelope's last ended_at: " + ", ".join(
                               f"{m} {w:.3f} ({w / e0:.2f}x)" for m, w in env.items()))
            out.append("\nViewers: " + "; ".join(
                f"**{m}**: {viewer_notes(m, v)}" for m, v in modes.items()
                if v and m != "0 viewers"))
            out.append("")
    return "\n".join(out)


def viewer_notes(mode: str, runs: list[dict[str, Any]]) -> str:
    if mode == "2 raw viewers":
        raws = [s for r in runs for s in r.get("raw", [])]
        if not raws:
            return "no stats"
        seen = [s.get("lines_seen", 0) for s in raws]
        snaps = [max(0, s.get("snapshots", 0) - 1) for s in raws]
        early = [s["closed_early"] for s in raws if s.get("closed_early")]
        cpu = [s["cpu_s"] for s in raws if s.get("cpu_s") == s.get("cpu_s")]
        verdicts = sum(bool(s.get("verdict")) for s in raws)
        return (f"lines seen per viewer {min(seen):,}-{max(seen):,} (median {med(seen):,.0f}) "
                f"of {FLOOD_RANKS * FLOOD_LINES:,}; resync snapshots per viewer "
                f"{min(snaps)}-{max(snaps)}; verdict received {verdicts}/{len(raws)}; "
                f"closed early {len(early)}"
                + (f" ({'; '.join(sorted(set(early)))[:200]})" if early else "")
                + (f"; CPU per viewer {med(cpu):.2f} s" if cpu else ""))
    if mode == "2 attach TUIs":
        tuis = [t for r in runs for t in r.get("tuis", [])]
        shown = [t["verdict_shown_after_exit_s"] for t in tuis
                 if t["verdict_shown_after_exit_s"] is not None]
        over = sum(1 for t in tuis if t["found_run_over"])
        # exited at once with one line and status 1 (older JSON: no error_line, empty screen)
        failed = [t for t in tuis if t.get("error_line") or (
            t["pane"].endswith(" 1") and not t["header_at_end"] and not t["found_run_over"])]
        stale = [t for t in tuis if t["verdict_shown_after_exit_s"] is None
                 and not t["found_run_over"] and t not in failed]
        errors = "; ".join(sorted({t["error_line"] for t in failed if t.get("error_line")}))
        dropped = sum(r["viewers"]["dropped_before_ranks_ended"] for r in runs)
        headers = ", ".join(sorted({f"'{t['header_at_end'].split('·')[0].strip()}'"
                                    for t in stale}))
        notices = sum(t["lost_the_run"] for t in stale)
        cpu = [t["cpu_s_at_run_end"] for t in tuis if t.get("cpu_s_at_run_end") is not None]
        ends = [t["ended_by"] for t in tuis]
        return (f"connections closed by the supervisor while ranks ran: {dropped} of "
                f"{len(tuis)}; verdict shown by {len(shown)}/{len(tuis)}"
                + (f" ({med(shown):.2f} s after the supervisor's exit, max {max(shown):.2f})"
                   if shown else "")
                + (f"; {over} started after the run was over (printed its verdict, exit 0)"
                   if over else "")
                + (f"; {len(failed)} exited 1 at once" + (f" ({errors})" if errors else "")
                   if failed else "")
                + (f"; **{len(stale)} still showed {headers} {VERDICT_WAIT:g} s after the "
                   f"run's end** ({notices} with the 'lost the run' notice on screen)"
                   if stale else "")
                + "; ended by " + ", ".join(f"{e} x{ends.count(e)}" for e in sorted(set(ends)))
                + (f"; CPU per TUI by the run's end {med(cpu):.2f} s" if cpu else "")
                + f"; tmux server CPU {med([r.get('tmux_server_cpu_s', 0) for r in runs]):.2f} s")
    if mode == "1 stuck viewer":
        still = sum(1 for r in runs if r["viewers"]["connected_at_end"] >= 1)
        return (f"its connection still open (in /proc/net/unix) when the supervisor ended in "
                f"{still}/{len(runs)} runs; unread bytes waiting for it at the end, KiB: "
                + ", ".join(f"{r.get('stuck_bytes_waiting_at_end', 0) // 1024}" for r in runs))
    return ""


def targets(results: dict[str, Any]) -> list[dict[str, str]]:
    sc = results["scenarios"]
    found: list[dict[str, str]] = []

    def add(name: str, goal: str, measured: str, ok: bool) -> None:
        found.append({"target": name, "goal": goal, "measured": measured,
                      "result": "pass" if ok else "MISS"})

    if "frame" in sc:
        for kind, runs in sc["frame"]["runs"].items():
            if kind == "textual floor":
                continue
            frames = [r["first_frame_s"] for r in runs]
            add(f"attach first frame, {kind}", "<= 1 s (median and max)",
                f"median {med(frames) * 1000:.0f} ms, max {max(frames) * 1000:.0f} ms",
                max(frames) <= 1.0)
    if "flood" in sc:
        for variant, modes in sc["flood"]["variants"].items():
            if not modes["0 viewers"]:
                continue
            ref = ref_wall(modes)
            for mode, runs in modes.items():
                if mode == "0 viewers" or not runs:
                    continue
                wall = med(steady(runs, "ranks_wall_s") if variant == "socket"
                           else [r["ranks_wall_s"] for r in runs])
                add(f"flood ({variant}): ranks' wall, {mode}", "<= 1.25x 0 viewers",
                    f"{wall:.3f} s vs {ref:.3f} s ({wall / ref:.2f}x)", wall <= 1.25 * ref)
            lost = [r["lines"]["lost"] for runs in modes.values() for r in runs]
            ident = all(r["lines"]["identical"] for runs in modes.values() for r in runs)
            add(f"flood ({variant}): rank logs whole", "0 lines lost, every byte",
                f"lost {sum(lost)} in {len(lost)} runs; byte-identical {ident}",
                sum(lost) == 0 and ident)
    return found


# ------------------------------------------------------------------------- main


def warm_up(ctx: suite.Ctx) -> None:
    """One untimed flood (page cache, .pyc of the supervisor and the ranks)."""
    slot = ctx.slot("attach-warmup", "flood", 0)
    launch = headless(ctx, FLOOD_RANKS, slot, [str(RANKS / "flood.py"), "1000"], devnull=True)
    launch.wait(60)


def leftovers(before: set[int]) -> list[str]:
    """Processes of ours still alive: any process whose command line names our out dir, a
    bench tmux socket or a rank program, and that was not there before the bench started."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in before or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
            if f"forgelm-bench-{os.getpid()}-" in cmd or "bench/ranks/" in cmd \
                    or "--raw-viewer" in cmd:
                found.append(f"{name} {cmd[:160]}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["--raw-viewer"]:
        return raw_viewer(args_in[1], args_in[2])
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 runs of everything (~2 min)")
    parser.add_argument("--runs", type=int, default=None,
                        help="runs per case, frame and flood (default 10; 3 with --quick)")
    parser.add_argument("--frame-runs", type=int, default=None, help="override --runs for frame")
    parser.add_argument("--flood-runs", type=int, default=None, help="override --runs for flood")
    parser.add_argument("--only", default="frame,flood")
    parser.add_argument("--variants", default="socket,gated", help="flood variants")
    parser.add_argument("--quiet-cpus", type=float, default=0.5)
    parser.add_argument("--quiet-wait", type=float, default=None, help="30 s (5 quick)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None,
                        help="default bench/attach.json (the out dir with --quick)")
    parser.add_argument("--tables-from", type=Path, default=None,
                        help="only print the tables and targets of an earlier JSON")
    args = parser.parse_args(args_in)
    if args.tables_from is not None:
        old = json.loads(args.tables_from.read_text())
        print(tables(old) + "\n### attach targets\n\n" + suite.targets_table(targets(old)))
        return 0
    runs = args.runs or (3 if args.quick else 10)
    frame_runs = args.frame_runs or runs
    flood_runs = args.flood_runs or runs
    quiet_wait = args.quiet_wait if args.quiet_wait is not None else (5.0 if args.quick else 30.0)
    out = (args.out or BENCH / "out" / ("attach-" + time.strftime("%Y%m%d-%H%M%S"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or (out / "attach.json" if args.quick else BENCH / "attach.json")
    only = set(args.only.split(","))
    variants = [v for v in args.variants.split(",") if v]
    before = {int(p) for p in os.listdir("/proc") if p.isdigit()}

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    ctx = suite.Ctx(out)
    version = subprocess.run([tb.TMUX, "-V"], capture_output=True, text=True).stdout.strip()
    meta = suite.meta(argparse.Namespace(reps=None, flood_reps=flood_runs, quick=args.quick))
    meta.update({"tmux": version, "terminal": f"{tb.COLS}x{tb.ROWS}", "frame_runs": frame_runs,
                 "flood_runs": flood_runs, "cli": " ".join(ftui()), "variants": variants})
    results: dict[str, Any] = {"meta": meta, "scenarios": {}}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("frame", lambda: scenario_frame(ctx, frame_runs, (2, 8))),
        ("flood", lambda: scenario_flood(ctx, flood_runs, variants)),
    ]
    print(f"bench/attach: out {out}; frame runs {frame_runs}, flood runs {flood_runs}",
          flush=True)
    started = time.monotonic()
    try:
        warm_up(ctx)
        for key, step in steps:
            if key in only:
                load = suite.wait_quiet(args.quiet_cpus, quiet_wait)
                print(f"  load before {key}: {load['busy_cpus']} of {os.cpu_count()} CPUs busy "
                      f"(loadavg {load['loadavg'][0]})", flush=True)
                results["scenarios"][key] = step()
                results["scenarios"][key]["load_before"] = load
                killed = close_all()
                if killed:
                    results["scenarios"][key]["leftovers_killed"] = killed
    finally:
        killed = close_all()
        if killed:
            print(f"bench/attach: killed {killed} leftover process(es)", file=sys.stderr)
    time.sleep(0.5)
    left = leftovers(before)
    results["meta"]["bench_seconds"] = round(time.monotonic() - started, 1)
    results["meta"]["commit_at_end"] = suite.meta(
        argparse.Namespace(reps=None, flood_reps=None, quick=args.quick))["commit"]
    results["meta"]["processes_left_at_end"] = left
    results["targets"] = targets(results)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    text = (tables(results) + "\n### attach targets\n\n"
            + suite.targets_table(results["targets"]) + "\n")
    (out / "tables.md").write_text(text)
    print("\n" + text)
    if left:
        print("bench/attach: processes still alive at the end:\n  " + "\n  ".join(left))
    print(f"bench/attach: {results['meta']['bench_seconds']} s; raw numbers in {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
