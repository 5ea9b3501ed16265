"""forgelm-tui with the TUI in a real terminal (tmux), against itself with --no-tui.

    /work/venv/bin/python bench/tui.py [--quick] [--only cpu,flood,frame]

cpu    64 sleeping ranks: the supervisor's CPU (utime+stime from /proc/PID/stat) in a steady
       window, TUI vs --no-tui. Target: <= 15% of one core under the TUI.
flood  8 ranks x 100k lines of 100 B: the ranks' wall (envelope: first started_at to last
       ended_at), TUI vs --no-tui alternating. Target: within 10%; 0 lines lost in the rank logs.
frame  launch in tmux -> first capture-pane that shows the rank table. Target: <= 1 s.
       Floors measured the same way: a Textual app with one DataTable, and a bare print.

Every TUI run gets its own tmux server (``-L`` socket, ``-f /dev/null``, 200x60, CI unset),
started before the clock so the server's own start is not counted. The forgelm-tui pid is the
pane's pid and is checked against the parent pid the ranks record. Every wait has a deadline;
tmux servers and every process seen are killed at the end, also on failure or Ctrl+C.
See bench/README.md ("TUI") for the method, bench/RESULTS.md for numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import run as suite  # bench/run.py: processes, load probes, line counting
from run import CLK_TCK, FTUI, KNOWN, PYTHON, RANKS, BenchError, Proc, free_port, read_stat

BENCH = Path(__file__).resolve().parent
TMUX = shutil.which("tmux") or "tmux"
COLS, ROWS = 200, 60
POLL = 0.020  # capture-pane period while waiting for the first frame
SOCKETS = itertools.count()
SERVERS: list[Tmux] = []


# ------------------------------------------------------------------------- tmux


def tui_env() -> dict[str, str]:
    """The bench's environment for a TUI run: as run.py's, but CI unset (a real terminal)."""
    env = suite.bench_env()
    for key in ("CI", "TMUX", "TMUX_PANE", "NO_COLOR", "TEXTUAL"):
        env.pop(key, None)
    return env


class Tmux:
    """A private tmux server (own socket, no config) with an idle session keeping it up."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket = f"forgelm-bench-{os.getpid()}-{next(SOCKETS)}"
        self.env = env
        self.server: Proc | None = None
        self.socket_path: Path | None = None
        SERVERS.append(self)
        self.cmd("new-session", "-d", "-s", "idle", "-x", str(COLS), "-y", str(ROWS),
                 "sleep", "600")
        pid, path = self.cmd("display-message", "-p", "-t", "idle",
                             "#{pid} #{socket_path}").split(maxsplit=1)
        self.server = Proc.of(int(pid))
        self.socket_path = Path(path.strip())
        # A pane whose program ended stays, so its last screen can be kept as evidence.
        self.cmd("set-option", "-g", "remain-on-exit", "on")

    def cmd(self, *args: str, timeout: float = 10.0, check: bool = True) -> str:
        done = subprocess.run([TMUX, "-L", self.socket, "-f", "/dev/null", *args],
                              capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and done.returncode != 0:
            raise BenchError(f"tmux {' '.join(args[:2])}: {done.stderr.strip()}")
        return done.stdout

    def start(self, name: str, argv: Sequence[str], cwd: Path) -> float:
        """Start ``argv`` (exec'd directly, no shell) in a new session; perf_counter before."""
        t0 = time.perf_counter()
        self.cmd("new-session", "-d", "-s", name, "-x", str(COLS), "-y", str(ROWS),
                 "-c", str(cwd), *argv)
        return t0

    def pane_pid(self, name: str) -> int:
        return int(self.cmd("display-message", "-p", "-t", name, "#{pane_pid}").strip())

    def capture(self, name: str) -> str:
        return self.cmd("capture-pane", "-p", "-t", name)

    def keys(self, name: str, *keys: str) -> None:
        self.cmd("send-keys", "-t", name, *keys)

    def cpu_ticks(self) -> int | None:
        stat = read_stat(self.server.pid) if self.server else None
        return int(stat[11]) + int(stat[12]) if stat else None

    def close(self) -> None:
        """kill-server, then SIGKILL anything that was under it and is still alive."""
        under: list[Proc] = []
        if self.server is not None:
            under = [p for p in map(Proc.of, suite.descendants(self.server.pid)) if p]
        self.cmd("kill-server", check=False)
        for proc in (*under, *([self.server] if self.server else [])):
            wait_gone(proc, 2.0)
            proc.kill()
        if self.socket_path is not None:  # tmux 3.3 leaves the socket file behind
            self.socket_path.unlink(missing_ok=True)
        if self in SERVERS:
            SERVERS.remove(self)


def close_all() -> int:
    """Every tmux server this bench started, then every process it has seen."""
    for server in list(SERVERS):
        with contextlib.suppress(Exception):
            server.close()
    return suite.kill_leftovers()


# ------------------------------------------------------------------------- waiting


def wait_gone(proc: Proc, timeout: float) -> bool:
    """Wait (pidfd, no polling) for a process that need not be our child; True if it ended."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return True
    try:
        if not proc.alive():
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while proc.alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(min(left, 0.2) * 1000)  # a zombie stays readable: re-check alive()
        return True
    finally:
        os.close(fd)


def wait_for(what: str, check: Callable[[], Any], timeout: float, period: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(period)


def ready_ranks(slot: Path, nproc: int) -> dict[int, tuple[int, int]]:
    """rank -> (pid, parent pid) from the sleeper's DIR/ready-RANK files."""
    found = {}
    for rank in range(nproc):
        with contextlib.suppress(OSError, ValueError):
            pid, ppid = (slot / f"ready-{rank}").read_text().split()
            found[rank] = (int(pid), int(ppid))
    return found


def remember(pids: Sequence[int]) -> None:
    for pid in pids:
        proc = Proc.of(pid)
        if proc is not None:
            KNOWN.add(proc)


def remember_tree(pid: int) -> None:
    """The supervisor, its guardian and its ranks: killed at the end if still alive."""
    remember([pid, *suite.descendants(pid)])


def ticks(pid: int) -> int | None:
    stat = read_stat(pid)
    return int(stat[11]) + int(stat[12]) if stat else None


def envelope(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "envelope.json"
    with contextlib.suppress(OSError, ValueError):
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    return None


def ranks_wall(env: dict[str, Any]) -> float:
    """First rank's started_at to last rank's ended_at (ms resolution in the envelope)."""
    ranks = env["ranks"]
    start = min(datetime.fromisoformat(r["started_at"]) for r in ranks)
    end = max(datetime.fromisoformat(r["ended_at"]) for r in ranks)
    return (end - start).total_seconds()


def tui_argv(nproc: int, run_dir: Path, target: Sequence[str]) -> list[str]:
    return [FTUI, "--tui", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), "--run-dir", str(run_dir), *target]


def variant_argv(mode: str, argv: list[str], slot: Path,
                 window: tuple[float, float] = (0.0, 3600.0)) -> list[str]:
    """``tui-off-PART`` / ``tui-profile``: the same TUI run through bench/profile_tui.py."""
    if mode == "tui":
        return argv
    wrap = [PYTHON, str(BENCH / "profile_tui.py")]
    if mode == "tui-profile":
        wrap += ["--profile", str(slot / "main-thread.pstats"),
                 "--from", f"{window[0]:g}", "--to", f"{window[1]:g}"]
    else:
        wrap += ["--off", mode.removeprefix("tui-off-")]
    return [*wrap, "--", *argv[1:]]


def thread_ticks(pid: int) -> dict[int, int]:
    """utime+stime per thread of ``pid``: the main thread (tid == pid) against the others."""
    found = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            stat = read_stat_path(f"/proc/{pid}/task/{tid}/stat")
            if stat is not None:
                found[int(tid)] = int(stat[11]) + int(stat[12])
    return found


def read_stat_path(path: str) -> list[str] | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].decode().split()


def headless_launch(ctx: suite.Ctx, nproc: int, slot: Path,
                    target: Sequence[str]) -> suite.Launch:
    return ctx.launch(suite.A, nproc, slot, target)  # --no-tui, CI=true, stdout to a file


def quit_tui(tmux: Tmux, name: str, proc: Proc, slot: Path, timeout: float = 20.0) -> str:
    """After the run: wait for the verdict on screen, press q; SIGTERM, then SIGKILL, if stuck.

    Returns how the app ended ("q", "SIGTERM", "SIGKILL"); the last screen goes to slot.
    """
    with contextlib.suppress(BenchError):
        wait_for("FINISHED on screen", lambda: "FINISHED" in tmux.capture(name), timeout, 0.05)
    (slot / "screen-end.txt").write_text(tmux.capture(name))
    tmux.keys(name, "q")
    if wait_gone(proc, timeout):
        return "q"
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    if wait_gone(proc, timeout):
        return "SIGTERM"
    proc.kill()
    return "SIGKILL"


# ------------------------------------------------------------------------- a. cpu


def cpu_run(ctx: suite.Ctx, mode: str, rep: int, nproc: int, sleep: float,
            window: tuple[float, float], ranks: str = "sleeper") -> dict[str, Any]:
    """One run of ``nproc`` sleeping ranks (``ranks`` "stepper": ranks reporting 10 steps and
    a loss a second, bench/ranks/stepper.py); supervisor CPU sampled each second until the
    window ends; the window's share of one core is the result."""
    slot = ctx.slot("tui-cpu", mode, rep)
    run_dir = slot / "run"
    target = [str(RANKS / f"{ranks}.py"), str(slot), str(sleep)]
    tmux: Tmux | None = None
    launch: suite.Launch | None = None
    try:
        if mode.startswith("tui"):
            tmux = Tmux(tui_env())
            argv = variant_argv(mode, tui_argv(nproc, run_dir, target), slot, window)
            t0 = tmux.start("run", argv, slot)
            pid = tmux.pane_pid("run")
        else:
            launch = headless_launch(ctx, nproc, slot, target)
            t0, pid = launch.t0, launch.pid
        sup = Proc.of(pid)
        if sup is None:
            raise BenchError(f"cpu: forgelm-tui ended at once; see {slot}")
        KNOWN.add(sup)
        samples: list[dict[str, Any]] = []
        all_ready_at = None
        parents: set[int] = set()
        threads: list[dict[int, int]] = []
        for second in itertools.count():
            at = t0 + second
            time.sleep(max(0.0, at - time.perf_counter()))
            total, idle = suite._cpu_times()
            samples.append({"t": round(time.perf_counter() - t0, 3), "sup": ticks(pid),
                            "tmux": tmux.cpu_ticks() if tmux else None,
                            "total": total, "idle": idle})
            if samples[-1]["sup"] is None:
                raise BenchError(f"cpu: forgelm-tui ended at {second} s; see {slot}")
            if all_ready_at is None:
                ready = ready_ranks(slot, nproc)
                if len(ready) == nproc:
                    all_ready_at = time.perf_counter() - t0
                    parents = {ppid for _, ppid in ready.values()}
                    remember([p for p, _ in ready.values()])
                    remember_tree(pid)
            if second in (int(window[0]), int(window[1])):
                threads.append(thread_ticks(pid))
            if tmux is not None and second == int(sum(window) / 2):
                (slot / "screen-mid.txt").write_text(tmux.capture("run"))
            if second >= window[1]:
                break
        if all_ready_at is None or all_ready_at > window[0]:
            raise BenchError(f"cpu: ranks not all ready by {window[0]:g} s; see {slot}")
        if parents != {pid}:
            raise BenchError(f"cpu: ranks' parent {parents} is not the pane/launcher pid {pid}")
        first, last = samples[int(window[0])], samples[int(window[1])]
        span = last["t"] - first["t"]
        share = (last["sup"] - first["sup"]) / CLK_TCK / span
        tmux_share = ((last["tmux"] - first["tmux"]) / CLK_TCK / span) if tmux else None
        busy = 1 - (last["idle"] - first["idle"]) / max(1, last["total"] - first["total"])
        main_ticks = threads[1].get(pid, 0) - threads[0].get(pid, 0)
        other_ticks = sum(t - threads[0].get(tid, 0) for tid, t in threads[1].items() if tid != pid)
        per_second = [(b["sup"] - a["sup"]) / CLK_TCK / (b["t"] - a["t"])
                      for a, b in itertools.pairwise(samples)]
        if tmux is not None:
            proc = Proc.of(pid)
            wait_for("the envelope", lambda: envelope(run_dir), sleep + 60, 0.1)
            ended = quit_tui(tmux, "run", proc, slot) if proc else "gone"
        else:
            assert launch is not None
            suite.check_rc(mode, launch.wait(sleep + 60), {0}, slot)
            ended = "exit"
        return {"cpu_share": share, "tmux_share": tmux_share,
                "main_thread_share": main_ticks / CLK_TCK / span,
                "other_threads_share": other_ticks / CLK_TCK / span,
                "threads": len(threads[1]),
                "machine_busy_cpus": busy * (os.cpu_count() or 1),
                "all_ready_s": all_ready_at, "window_s": span, "per_second": per_second,
                "ended_by": ended}
    finally:
        if tmux is not None:
            tmux.close()
        if launch is not None:
            launch.kill()


def scenario_cpu(ctx: suite.Ctx, reps: int, nproc: int, sleep: float,
                 window: tuple[float, float], variants: Sequence[str],
                 ranks: str = "sleeper") -> dict[str, Any]:
    modes = ["tui", "no-tui", *variants]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for rep in range(reps):
        for mode in modes:
            result = cpu_run(ctx, mode, rep, nproc, sleep, window, ranks)
            runs[mode].append(result)
            print(f"  cpu rep {rep} {mode}: {result['cpu_share'] * 100:.1f}% of a core "
                  f"(main thread {result['main_thread_share'] * 100:.1f}%, "
                  f"{result['threads'] - 1} other threads "
                  f"{result['other_threads_share'] * 100:.1f}%) "
                  f"(tmux {fmt_pct(result['tmux_share'])}, machine busy "
                  f"{result['machine_busy_cpus']:.2f} CPUs, ranks ready at "
                  f"{result['all_ready_s']:.1f} s)", flush=True)
    return {"nproc": nproc, "ranks": ranks, "sleep_s": sleep, "window_s": list(window),
            "runs": runs}


def fmt_pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


# ------------------------------------------------------------------------- b. flood


def flood_run(ctx: suite.Ctx, mode: str, rep: int) -> dict[str, Any]:
    slot = ctx.slot("tui-flood", mode, rep)
    run_dir = slot / "run"
    nproc = suite.FLOOD_RANKS
    target = [str(RANKS / "flood.py"), str(suite.FLOOD_LINES)]
    tmux: Tmux | None = None
    launch: suite.Launch | None = None
    try:
        if mode.startswith("tui"):
            tmux = Tmux(tui_env())
            t0 = tmux.start("run", variant_argv(mode, tui_argv(nproc, run_dir, target), slot),
                            slot)
            proc = Proc.of(tmux.pane_pid("run"))
            if proc is None:
                raise BenchError(f"flood: forgelm-tui ended at once; see {slot}")
            KNOWN.add(proc)
            env = wait_for("the envelope", lambda: envelope(run_dir), 600, 0.02)
            to_envelope = time.perf_counter() - t0
            sup_cpu = (ticks(proc.pid) or 0) / CLK_TCK  # at the envelope, before quitting
            per_thread = thread_ticks(proc.pid)
            split = {"main_thread_cpu_s": per_thread.get(proc.pid, 0) / CLK_TCK,
                     "other_threads_cpu_s": sum(t for tid, t in per_thread.items()
                                                if tid != proc.pid) / CLK_TCK}
            remember_tree(proc.pid)
            ended = quit_tui(tmux, "run", proc, slot)
        else:
            launch = headless_launch(ctx, nproc, slot, target)
            done = launch.wait(600)
            suite.check_rc(mode, done, {0}, slot)
            env = envelope(run_dir)
            if env is None:
                raise BenchError(f"flood: no envelope in {run_dir}")
            to_envelope, sup_cpu, ended = done.wall, done.own_cpu, "exit"
            split = {}
        if env["exit_code"] != 0:
            raise BenchError(f"flood: {mode} run ended with {env['exit_code']}; see {slot}")
        logs = [run_dir / f"rank-{r}.stdout.log" for r in range(nproc)]
        count = suite.count_lines(logs, suite.PAYLOAD, nproc, False).as_dict()
        whole = count["lost"] == count["garbled"] == count["duplicates"] == 0
        if whole:  # ~80 MB of logs (and as much headless stdout) per run
            for path in logs:
                path.unlink(missing_ok=True)
            if launch is not None:
                launch.stdout_path().unlink(missing_ok=True)
        return {"ranks_wall_s": ranks_wall(env), "launch_to_envelope_s": to_envelope,
                "supervisor_cpu_s": sup_cpu, "lines": count, "ended_by": ended, **split}
    finally:
        if tmux is not None:
            tmux.close()
        if launch is not None:
            launch.kill()


def scenario_flood(ctx: suite.Ctx, reps: int, variants: Sequence[str]) -> dict[str, Any]:
    modes = ["tui", "no-tui", *variants]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for rep in range(reps):
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            result = flood_run(ctx, mode, rep)
            runs[mode].append(result)
            split = (f" (main thread {result['main_thread_cpu_s']:.2f} s)"
                     if "main_thread_cpu_s" in result else "")
            print(f"  flood rep {rep} {mode}: ranks wall {result['ranks_wall_s']:.2f} s, "
                  f"supervisor CPU {result['supervisor_cpu_s']:.2f} s{split}, "
                  f"lost {result['lines']['lost']}", flush=True)
    return {"ranks": suite.FLOOD_RANKS, "lines_per_rank": suite.FLOOD_LINES, "line_bytes": 100,
            "runs": runs}


# ------------------------------------------------------------------------- c. first frame


def shows_table(screen: str) -> bool:
    lowered = screen.lower()
    return "rank" in lowered and "state" in lowered and (
        "starting" in lowered or "running" in lowered)


def frame_run(ctx: suite.Ctx, kind: str, rep: int, nproc: int) -> dict[str, Any]:
    slot = ctx.slot("tui-frame", kind.replace(" ", "-"), rep)
    if kind.startswith("forgelm-tui"):
        argv = tui_argv(nproc, slot / "run", [str(RANKS / "sleeper.py"), str(slot), "60"])
        if kind == "forgelm-tui marked":  # the same run through profile_tui.py --marks
            argv = [PYTHON, str(BENCH / "profile_tui.py"), "--marks", str(slot / "marks.jsonl"),
                    "--", *argv[1:]]
    elif kind == "textual floor":
        argv = [PYTHON, str(BENCH / "tui_floor_app.py")]
    else:  # print floor: tmux + python start + the polling itself
        argv = [PYTHON, "-c", "import time; print('rank state starting', flush=True); "
                "time.sleep(60)"]
    tmux = Tmux(tui_env())
    try:
        t0 = tmux.start("run", argv, slot)
        t0_wall = time.time() - (time.perf_counter() - t0)
        proc = Proc.of(tmux.pane_pid("run"))
        if proc is not None:
            KNOWN.add(proc)
        first_text = None
        deadline = t0 + 30
        polls = 0
        while True:
            before = time.perf_counter()
            screen = tmux.capture("run")
            after = time.perf_counter()
            polls += 1
            if first_text is None and screen.strip():
                first_text = after - t0
            if shows_table(screen):
                break
            if after > deadline:
                (slot / "screen-timeout.txt").write_text(screen)
                raise BenchError(f"frame: {kind} showed no rank table in 30 s; see {slot}")
            time.sleep(max(0.0, before + POLL - time.perf_counter()))
        (slot / "screen-first.txt").write_text(screen)
        result: dict[str, Any] = {"first_frame_s": after - t0, "capture_started_s": before - t0,
                  "first_text_s": first_text, "polls": polls}
        if proc is not None:
            if kind.startswith("forgelm-tui"):
                with contextlib.suppress(BenchError):  # so no rank is left for the cleanup
                    wait_for("ranks ready", lambda: len(ready_ranks(slot, nproc)) == nproc, 30)
                remember_tree(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)  # forgelm-tui: outside stop, app exits
            result["ended_by_sigterm"] = wait_gone(proc, 30)
        if kind == "forgelm-tui marked":
            marks: dict[str, float] = {}
            with contextlib.suppress(OSError):
                for line in (slot / "marks.jsonl").read_text().splitlines():
                    item = json.loads(line)
                    name = item["mark"]
                    while name in marks:
                        name += "'"
                    marks[name] = item["t"] - t0_wall
            result["marks_s"] = marks
        return result
    finally:
        tmux.close()


def import_walls(reps: int) -> dict[str, list[float]]:
    """Wall of a fresh python doing only some imports: the floor under any first frame."""
    codes = {
        "python -c pass": "pass",
        "import textual.app, textual.widgets": "import textual.app, textual.widgets",
        "import forgelm_tui.cli, .plan, .run (headless path)":
            "import forgelm_tui.cli, forgelm_tui.plan.planner, forgelm_tui.session.run",
        "... + forgelm_tui.tui.launch (TUI path)":
            ("import forgelm_tui.cli, forgelm_tui.plan.planner, forgelm_tui.session.run, "
             "forgelm_tui.tui.launch"),
    }
    walls: dict[str, list[float]] = {k: [] for k in codes}
    for _ in range(reps):
        for label, code in codes.items():
            t0 = time.perf_counter()
            # Not subprocess.run(timeout=...): its wait polls in sleeps of up to 50 ms.
            child = subprocess.Popen([PYTHON, "-c", code], env=tui_env())
            child_proc = Proc.of(child.pid)
            ended = child_proc is None or wait_gone(child_proc, 60)
            wall = time.perf_counter() - t0
            if not ended:
                child.kill()
            if child.wait(10) != 0 or not ended:
                raise BenchError(f"imports: python -c {code!r} failed or hung")
            walls[label].append(wall)
    return walls


def scenario_frame(ctx: suite.Ctx, reps: int, nproc: int, marked: bool) -> dict[str, Any]:
    kinds: tuple[str, ...] = ("forgelm-tui", "textual floor", "print floor")
    if marked:
        kinds += ("forgelm-tui marked",)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for rep in range(reps):
        for kind in kinds:
            result = frame_run(ctx, kind, rep, nproc)
            runs[kind].append(result)
        print(f"  frame rep {rep}: " + ", ".join(
            f"{k} {runs[k][-1]['first_frame_s'] * 1000:.0f} ms" for k in kinds), flush=True)
    walls = import_walls(reps)
    for label, values in walls.items():
        print(f"  import {label}: {statistics.median(values) * 1000:.0f} ms", flush=True)
    return {"nproc": nproc, "poll_s": POLL, "runs": runs, "import_walls_s": walls}


# ------------------------------------------------------------------------- reporting


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def span(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    return (f"{med(values) * scale:.{digits}f} | "
            f"{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}")


def tables(results: dict[str, Any]) -> str:
    sc = results["scenarios"]
    out: list[str] = []
    if "cpu" in sc:
        c = sc["cpu"]
        kind = {"stepper": "ranks reporting 10 steps/s"}.get(c.get("ranks", ""), "sleeping ranks")
        out.append(f"### TUI a. supervisor CPU, {c['nproc']} {kind}, window "
                   f"{c['window_s'][0]:g}-{c['window_s'][1]:g} s after start (% of one core)\n")
        out.append("| mode | median | min-max | per run | main thread / other threads, median "
                   "| tmux server (TUI) | machine busy, CPUs | ranks all ready at, s |\n"
                   "|---|---|---|---|---|---|---|---|")
        labels = {"tui": "forgelm-tui --tui", "no-tui": "forgelm-tui --no-tui",
                  "tui-profile": "--tui under cProfile (main thread)"}
        for mode, runs in c["runs"].items():
            shares = [r["cpu_share"] for r in runs]
            tmux = [r["tmux_share"] for r in runs if r["tmux_share"] is not None]
            label = labels.get(mode, f"--tui with {mode.removeprefix('tui-off-')} off")
            split = (f"{med([r['main_thread_share'] for r in runs]) * 100:.1f} / "
                     f"{med([r['other_threads_share'] for r in runs]) * 100:.1f}")
            out.append(f"| {label} | "
                       f"{span(shares, 100, 1)} | {[round(s * 100, 1) for s in shares]} | "
                       f"{split} | "
                       f"{span(tmux, 100, 1).replace(' | ', ' (') + ')' if tmux else '-'} | "
                       f"{[round(r['machine_busy_cpus'], 2) for r in runs]} | "
                       f"{[round(r['all_ready_s'], 1) for r in runs]} |")
        out.append("")
    if "flood" in sc:
        f = sc["flood"]
        out.append(f"### TUI b. log flood, {f['ranks']} ranks x {f['lines_per_rank']} lines of "
                   f"{f['line_bytes']} B: ranks' wall (envelope), s\n")
        out.append("| mode | ranks wall median | min-max | ratio | supervisor CPU, s | "
                   "launch -> envelope, s | lines lost per run (rank logs) |\n"
                   "|---|---|---|---|---|---|---|")
        ref = med([r["ranks_wall_s"] for r in f["runs"]["no-tui"]])
        labels = {"tui": "forgelm-tui --tui", "no-tui": "forgelm-tui --no-tui (stdout file)",
                  "tui-profile": "--tui under cProfile (main thread)"}
        for mode, runs in f["runs"].items():
            walls = [r["ranks_wall_s"] for r in runs]
            label = labels.get(mode, f"--tui with {mode.removeprefix('tui-off-')} off")
            out.append(f"| {label} "
                       f"| {span(walls)} | {med(walls) / ref:.3f} | "
                       f"{med([r['supervisor_cpu_s'] for r in runs]):.2f} | "
                       f"{med([r['launch_to_envelope_s'] for r in runs]):.2f} | "
                       f"{[r['lines']['lost'] + r['lines']['garbled'] for r in runs]} |")
        out.append("")
    if "frame" in sc:
        fr = sc["frame"]
        out.append(f"### TUI c. launch in tmux -> first screen with the rank table "
                   f"(ms; capture-pane every {fr['poll_s'] * 1000:.0f} ms)\n")
        out.append("| what | median | min-max | first non-empty screen, median |\n"
                   "|---|---|---|---|")
        for kind, runs in fr["runs"].items():
            label = {"forgelm-tui": f"forgelm-tui --tui, {fr['nproc']} ranks",
                     "forgelm-tui marked": "the same through bench/profile_tui.py --marks",
                     "textual floor": "floor: Textual app with one DataTable",
                     "print floor": "floor: python printing the words"}[kind]
            firsts = [r["first_text_s"] for r in runs if r["first_text_s"] is not None]
            out.append(f"| {label} | {span([r['first_frame_s'] for r in runs], 1000, 0)} | "
                       f"{med(firsts) * 1000:.0f} |")
        marked = [r["marks_s"] for r in fr["runs"].get("forgelm-tui marked", [])
                  if r.get("marks_s")]
        if marked:
            out.append("\nTimeline of the marked runs (ms after the tmux command was started, "
                       "median):\n\n| step | median ms | min-max |\n|---|---|---|")
            names = list(dict.fromkeys(n for m in marked for n in m))
            for name in names:
                values = [m[name] for m in marked if name in m]
                out.append(f"| {name} | {span(values, 1000, 0)} |")
            seen = [r["first_frame_s"] for r in fr["runs"]["forgelm-tui marked"]]
            out.append(f"| rank table seen by capture-pane | {span(seen, 1000, 0)} |")
        out.append("\n| fresh python, imports only | median ms | min-max |\n|---|---|---|")
        for label, values in fr["import_walls_s"].items():
            out.append(f"| {label} | {span(values, 1000, 0)} |")
        out.append("")
    return "\n".join(out)


def targets(results: dict[str, Any]) -> list[dict[str, str]]:
    sc = results["scenarios"]
    found: list[dict[str, str]] = []

    def add(name: str, goal: str, measured: str, ok: bool) -> None:
        found.append({"target": name, "goal": goal, "measured": measured,
                      "result": "pass" if ok else "MISS"})

    if "cpu" in sc:
        runs = sc["cpu"]["runs"]
        tui = med([r["cpu_share"] for r in runs["tui"]])
        head = med([r["cpu_share"] for r in runs["no-tui"]])
        kind = "stepping" if sc["cpu"].get("ranks") == "stepper" else "sleeping"
        add(f"supervisor CPU under the TUI, {sc['cpu']['nproc']} {kind} ranks",
            "<= 15% of one core", f"{tui * 100:.1f}% (--no-tui {head * 100:.1f}%)", tui <= 0.15)
    if "flood" in sc:
        runs = sc["flood"]["runs"]
        tui = med([r["ranks_wall_s"] for r in runs["tui"]])
        head = med([r["ranks_wall_s"] for r in runs["no-tui"]])
        add("flood: ranks' wall under the TUI", "within 10% of --no-tui",
            f"{tui:.2f} s vs {head:.2f} s ({tui / head:.3f}x)", tui <= 1.10 * head)
        lost = {m: [r["lines"]["lost"] + r["lines"]["garbled"] for r in v]
                for m, v in runs.items()}
        add("flood: 0 lines lost in the rank logs", "0 in both modes",
            f"--tui {lost['tui']}, --no-tui {lost['no-tui']}",
            all(x == 0 for v in lost.values() for x in v))
    if "frame" in sc:
        fr = sc["frame"]["runs"]
        first = med([r["first_frame_s"] for r in fr["forgelm-tui"]])
        floor = med([r["first_frame_s"] for r in fr["textual floor"]])
        add("first frame", "<= 1 s from launch",
            f"{first * 1000:.0f} ms (Textual floor {floor * 1000:.0f} ms)", first <= 1.0)
    return found


# ------------------------------------------------------------------------- main


def warm_up(ctx: suite.Ctx) -> None:
    """One untimed TUI run and one headless run, so page cache and .pyc files are warm."""
    slot = ctx.slot("tui-warmup", "tui", 0)
    tmux = Tmux(tui_env())
    try:
        tmux.start("run", tui_argv(2, slot / "run", [str(RANKS / "sleeper.py"), str(slot), "0"]),
                   slot)
        proc = Proc.of(tmux.pane_pid("run"))
        wait_for("the warm-up envelope", lambda: envelope(slot / "run"), 60, 0.05)
        if proc is not None:
            quit_tui(tmux, "run", proc, slot)
    finally:
        tmux.close()
    slot = ctx.slot("tui-warmup", "no-tui", 0)
    headless_launch(ctx, 2, slot, [str(RANKS / "sleeper.py"), str(slot), "0"]).wait(60)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="1 rep of cpu (window 5-15 s), 2 of flood, 3 of frame")
    parser.add_argument("--cpu-reps", type=int, default=None, help="default 3 (1 quick)")
    parser.add_argument("--flood-reps", type=int, default=None, help="default 5 (2 quick)")
    parser.add_argument("--frame-reps", type=int, default=None, help="default 9 (3 quick)")
    parser.add_argument("--nproc", type=int, default=64, help="ranks for cpu (64)")
    parser.add_argument("--frame-nproc", type=int, default=8, help="ranks for frame (8)")
    parser.add_argument("--cpu-ranks", choices=("sleeper", "stepper"), default="sleeper",
                        help="cpu: sleeping ranks, or ranks reporting 10 steps/s with a loss "
                             "(what the bars, the pace and the curves are fed)")
    parser.add_argument("--only", default="cpu,flood,frame")
    parser.add_argument("--frame-marks", action="store_true",
                        help="frame: also run forgelm-tui through bench/profile_tui.py --marks "
                             "(timeline of the steps to the first frame)")
    parser.add_argument("--cpu-variants", default="",
                        help="extra cpu modes, run through bench/profile_tui.py: off-table, "
                             "off-header, off-samples, off-logs, off-output, off-curves, profile "
                             "(comma list)")
    parser.add_argument("--flood-variants", default="",
                        help="extra flood modes, the same names as --cpu-variants")
    parser.add_argument("--quiet-cpus", type=float, default=0.5)
    parser.add_argument("--quiet-wait", type=float, default=None, help="30 s (5 quick)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None,
                        help="default bench/tui.json (the out dir with --quick)")
    args = parser.parse_args(argv)
    quick = args.quick
    cpu_reps = args.cpu_reps or (1 if quick else 3)
    flood_reps = args.flood_reps or (2 if quick else 5)
    frame_reps = args.frame_reps or (3 if quick else 9)
    window = (5.0, 15.0) if quick else (10.0, 40.0)
    sleep = window[1] + 5
    quiet_wait = args.quiet_wait if args.quiet_wait is not None else (5.0 if quick else 30.0)
    out = (args.out or BENCH / "out" / ("tui-" + time.strftime("%Y%m%d-%H%M%S"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or (out / "tui.json" if quick else BENCH / "tui.json")
    only = set(args.only.split(","))
    variants = [f"tui-{v}" for v in args.cpu_variants.split(",") if v]
    flood_variants = [f"tui-{v}" for v in args.flood_variants.split(",") if v]

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    ctx = suite.Ctx(out)
    version = subprocess.run([TMUX, "-V"], capture_output=True, text=True).stdout.strip()
    meta = suite.meta(argparse.Namespace(reps=None, flood_reps=flood_reps, quick=quick))
    meta.update({"tmux": version, "terminal": f"{COLS}x{ROWS}", "cpu_reps": cpu_reps,
                 "frame_reps": frame_reps})
    results: dict[str, Any] = {"meta": meta, "scenarios": {}}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("cpu", lambda: scenario_cpu(ctx, cpu_reps, args.nproc, sleep, window, variants,
                                     args.cpu_ranks)),
        ("flood", lambda: scenario_flood(ctx, flood_reps, flood_variants)),
        ("frame", lambda: scenario_frame(ctx, frame_reps, args.frame_nproc, args.frame_marks)),
    ]
    print(f"bench/tui: out {out}", flush=True)
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
                leftovers = close_all()
                if leftovers:
                    results["scenarios"][key]["leftovers_killed"] = leftovers
    finally:
        killed = close_all()
        if killed:
            print(f"bench/tui: killed {killed} leftover process(es)", file=sys.stderr)
    results["meta"]["bench_seconds"] = round(time.monotonic() - started, 1)
    # Other sessions may commit while the bench runs: say what the tree was at the end too.
    results["meta"]["commit_at_end"] = suite.meta(
        argparse.Namespace(reps=None, flood_reps=None, quick=quick))["commit"]
    results["targets"] = targets(results)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    text = tables(results) + "\n### TUI targets\n\n" + suite.targets_table(results["targets"])
    (out / "tables.md").write_text(text + "\n")
    print("\n" + text)
    print(f"bench/tui: {results['meta']['bench_seconds']} s; raw numbers in {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
