"""forgelm-tui --no-tui against torchrun, measured in the same run.

    /work/venv/bin/python bench/run.py [--quick] [--reps N] [--only a,b,...]

Every scenario runs forgelm-tui (A) and torchrun (B) alternately, A B A B ..., and reports the
median, min-max and the ratio forgelm-tui / torchrun. See bench/README.md for what each scenario
measures and how; raw numbers go to results.json, launcher output and run dirs to bench/out/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RANKS = BENCH / "ranks"
BIN = Path(sys.executable).parent
PYTHON = os.environ.get("BENCH_PYTHON", sys.executable)
FTUI = os.environ.get("BENCH_FORGELM_TUI", str(BIN / "forgelm-tui"))
TORCHRUN = os.environ.get("BENCH_TORCHRUN", str(BIN / "torchrun"))
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024

A, B = "forgelm-tui", "torchrun"
M = "minimal launcher"  # bench/floor_launcher.py: what a bare pidfd launcher reaches here
FLOOD_LINES = 100_000
FLOOD_RANKS = 8
PAYLOAD = re.compile(rb"r(\d{3}) line (\d{9}) x{79}")
FTUI_LINE = re.compile(rb"\[rank (\d+)\] (r(\d{3}) line (\d{9}) x{79})")
TEE_LINE = re.compile(rb"\[default(\d+)\]:(r(\d{3}) line (\d{9}) x{79})")


class BenchError(Exception):
    """A run that did not behave (timeout, wrong exit code, missing evidence)."""


# ------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Proc:
    """A pid plus its start time, so a recycled pid is never mistaken for it."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        stat = read_stat(pid)
        return None if stat is None else cls(pid, int(stat[19]))

    def alive(self) -> bool:
        """Running or stopped; a zombie (or a new process with the same pid) counts as dead."""
        stat = read_stat(self.pid)
        return stat is not None and stat[0] not in ("Z", "X") and int(stat[19]) == self.start

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)


def read_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [0] is the state, [19] the start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].decode().split()


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
    return found


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def vm_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


KNOWN: set[Proc] = set()  # every rank / child / launcher seen: killed at exit if still alive
LIVE_LAUNCHERS: list[Launch] = []


def kill_leftovers() -> int:
    """SIGKILL whatever this bench started that is still alive; returns how many."""
    for launch in list(LIVE_LAUNCHERS):
        launch.kill()
    survivors = [p for p in KNOWN if p.alive()]
    for proc in survivors:
        proc.kill()
    KNOWN.clear()
    return len(survivors)


@dataclass
class Ended:
    rc: int
    wall: float  # seconds from just before Popen to the launcher's end being seen
    end_time: float  # time.time() when the pidfd said the launcher had ended
    own_cpu: float  # user+sys of the launcher process itself (/proc/PID/stat of its zombie)
    children_cpu: float  # user+sys of the children it reaped (ranks, guardian, workers)
    rusage_cpu: float  # wait4's ru_utime+ru_stime: the launcher plus its reaped children
    rusage_maxrss_kib: int  # wait4's ru_maxrss: the max over the launcher and reaped children
    own_peak_kib: int | None = None  # VmHWM of the launcher itself (only when sampled)


class Launch:
    """One launcher process; its end is seen through a pidfd (no polling) and reaped by wait4."""

    def __init__(self, argv: Sequence[str], out: Path, *, cwd: Path, env: dict[str, str]) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        self.argv = list(argv)
        self.out = out
        self._stdout = open(out.with_suffix(".stdout"), "wb")  # noqa: SIM115
        self._stderr = open(out.with_suffix(".stderr"), "wb")  # noqa: SIM115
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=self._stderr,
            cwd=cwd,
            env=env,
            start_new_session=True,  # a Ctrl+C on the bench reaches only the bench
        )
        self.pid = self.proc.pid
        self.pidfd = os.pidfd_open(self.pid)
        self.me = Proc.of(self.pid)
        LIVE_LAUNCHERS.append(self)

    def wait(self, timeout: float, *, sample_rss: bool = False) -> Ended:
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        deadline = time.monotonic() + timeout
        peak: int | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise BenchError(f"timed out after {timeout:g} s: {' '.join(self.argv)}")
            step = min(left, 0.02) if sample_rss else left
            if poller.poll(step * 1000):
                break
            if sample_rss:
                hwm = vm_kib(self.pid, "VmHWM")
                if hwm is not None:
                    peak = max(peak or 0, hwm)
        end_time, end_perf = time.time(), time.perf_counter()
        os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        stat = read_stat(self.pid) or []
        _, status, usage = os.wait4(self.pid, 0)
        self._done()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        own = (int(stat[11]) + int(stat[12])) / CLK_TCK if stat else float("nan")
        kids = (int(stat[13]) + int(stat[14])) / CLK_TCK if stat else float("nan")
        return Ended(
            rc=self.proc.returncode,
            wall=end_perf - self.t0,
            end_time=end_time,
            own_cpu=own,
            children_cpu=kids,
            rusage_cpu=usage.ru_utime + usage.ru_stime,
            rusage_maxrss_kib=usage.ru_maxrss,
            own_peak_kib=peak,
        )

    def kill(self) -> None:
        """SIGKILL the launcher and everything under it, then reap it."""
        if self.proc.returncode is not None:
            return
        for pid in [self.pid, *descendants(self.pid)]:
            proc = Proc.of(pid)
            if proc is not None:
                KNOWN.add(proc)
                proc.kill()
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(self.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
        self._done()

    def _done(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
        self._stdout.close()
        self._stderr.close()
        if self in LIVE_LAUNCHERS:
            LIVE_LAUNCHERS.remove(self)

    def stdout_path(self) -> Path:
        return self.out.with_suffix(".stdout")


# ------------------------------------------------------------------------- launchers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launcher_argv(which: str, nproc: int, run_dir: Path, *extra: str) -> list[str]:
    port = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    if which == M:
        return [PYTHON, str(BENCH / "floor_launcher.py"), str(nproc), *extra]
    if which == A:
        return [FTUI, "--no-tui", "--nproc-per-node", str(nproc), *port,
                "--run-dir", str(run_dir), *extra]
    return [TORCHRUN, "--nproc-per-node", str(nproc), *port, *extra]


def bench_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("FORCE_COLOR", "PYTHONUNBUFFERED", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    env["CI"] = "true"  # forgelm-tui: headless even if the bench runs in a terminal
    env["OMP_NUM_THREADS"] = "1"  # both launchers would set it; torchrun also warns without
    return env


class Ctx:
    """Paths and settings shared by the scenarios."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.env = bench_env()
        self.counter = 0

    def slot(self, scenario: str, label: str, rep: int) -> Path:
        """A fresh directory for one run: launcher output, run dir, rank evidence."""
        self.counter += 1
        path = self.out / scenario / f"{rep:02d}-{label}-{self.counter:03d}"
        path.mkdir(parents=True)
        return path

    def launch(self, which: str, nproc: int, slot: Path, target: Sequence[str],
               *extra: str) -> Launch:
        argv = launcher_argv(which, nproc, slot / "run", *extra, *target)
        return Launch(argv, slot / "launcher", cwd=slot, env=self.env)


def rank_target(program: str, *args: str) -> list[str]:
    return [str(RANKS / program), *args]


def evidence(slot: Path, kind: str, nproc: int, timeout: float = 10.0) -> dict[int, str]:
    """The DIR/KIND-RANK files the rank programs leave, waiting up to ``timeout`` for all."""
    deadline = time.monotonic() + timeout
    while True:
        found = {}
        for rank in range(nproc):
            path = slot / f"{kind}-{rank}"
            with contextlib.suppress(OSError):
                found[rank] = path.read_text()
        if len(found) == nproc or time.monotonic() > deadline:
            return found
        time.sleep(0.002)


def remember_ranks(slot: Path, nproc: int) -> list[Proc]:
    procs = []
    for text in evidence(slot, "ready", nproc, timeout=0).values():
        for pid in text.split():
            proc = Proc.of(int(pid))
            if proc is not None:
                procs.append(proc)
                KNOWN.add(proc)
    return procs


def check_rc(which: str, ended: Ended, expected: set[int], slot: Path) -> None:
    if ended.rc not in expected:
        raise BenchError(f"{which} exited {ended.rc}, expected {sorted(expected)}; see {slot}")


def no_leftovers(slot: Path, nproc: int) -> int:
    """After a normal end, count (and kill) rank processes that outlived their launcher."""
    procs = remember_ranks(slot, nproc)
    left = [p for p in procs if p.alive()]
    for proc in left:
        proc.kill()
    return len(left)


# ------------------------------------------------------------------------- scenarios


Series = dict[str, list[float]]


def alternate(reps: int, minimal: bool = False) -> Iterator[tuple[int, str]]:
    """A B A B ...: forgelm-tui then torchrun (then the minimal launcher) in each repetition."""
    for rep in range(reps):
        yield rep, A
        yield rep, B
        if minimal:
            yield rep, M


def scenario_launch(ctx: Ctx, reps: int, sizes: Sequence[int]) -> dict[str, Any]:
    """a. launch + teardown of a no-op rank program; floor = N plain pythons in parallel."""
    result: dict[str, Any] = {}
    for nproc in sizes:
        series: Series = {A: [], B: [], M: [], "floor": []}
        cpu: Series = {A: [], B: [], M: []}
        for rep, which in alternate(reps, minimal=True):
            slot = ctx.slot("a-launch", f"n{nproc}-{which}", rep)
            ended = ctx.launch(which, nproc, slot, rank_target("noop.py")).wait(120)
            check_rc(which, ended, {0}, slot)
            series[which].append(ended.wall)
            cpu[which].append(ended.own_cpu)
            if which == M:
                series["floor"].append(floor_wall(nproc, slot, ctx.env))
        result[str(nproc)] = series
        result[f"{nproc}-launcher-cpu"] = cpu
        progress(f"a  N={nproc}", series)
    return result


def floor_wall(nproc: int, cwd: Path, env: dict[str, str]) -> float:
    """N plain ``python noop.py`` started together; their ends seen through pidfds.

    (``Popen.wait(timeout)`` polls with sleeps of up to 50 ms, which would inflate the floor.)
    """
    t0 = time.perf_counter()
    # Each in its own session, as both launchers start their ranks: with the kernel's
    # autogroup scheduling a session is a CPU-share group, and on a busy machine N processes
    # sharing the bench's group start up to 3x slower than N in groups of their own.
    procs = [subprocess.Popen([PYTHON, str(RANKS / "noop.py")], cwd=cwd, env=env,
                              start_new_session=True) for _ in range(nproc)]
    poller = select.poll()
    fds = {os.pidfd_open(p.pid): p for p in procs}
    for fd in fds:
        poller.register(fd, select.POLLIN)
    left, deadline = set(fds), time.monotonic() + 60
    while left and time.monotonic() < deadline:
        for fd, _ in poller.poll(1000):
            poller.unregister(fd)
            left.discard(fd)
    wall = time.perf_counter() - t0
    for fd, proc in fds.items():
        os.close(fd)
        if fd in left:
            proc.kill()
        proc.wait(10)
    if left:
        raise BenchError("floor: python noop.py did not end within 60 s")
    return wall


def scenario_peer(ctx: Ctx, reps: int) -> dict[str, Any]:
    """b. rank 1 exits 2 once both ranks are ready -> rank 0 receives SIGTERM."""
    series: Series = {A: [], B: [], M: []}
    launcher_rc: dict[str, list[int]] = {A: [], B: [], M: []}
    for rep, which in alternate(reps, minimal=True):
        slot = ctx.slot("b-peer", which, rep)
        target = rank_target("waiter.py", str(slot), "--exit-ranks", "1", "--exit-code", "2")
        ended = ctx.launch(which, 2, slot, target).wait(90)
        remember_ranks(slot, 2)
        exited = evidence(slot, "exit", 2, timeout=0)
        got = evidence(slot, "term", 2, timeout=0)
        if 1 not in exited or 0 not in got:
            raise BenchError(f"b: missing evidence (exit {exited}, term {got}) in {slot}")
        series[which].append(float(got[0]) - float(exited[1]))
        launcher_rc[which].append(ended.rc)
        no_leftovers(slot, 2)
    progress("b  exit->peer", series, ms=True)
    return {"series": series, "launcher_rc": launcher_rc}


def scenario_cancel(ctx: Ctx, reps: int, nproc: int = 4) -> dict[str, Any]:
    """c. SIGTERM to the launcher once all ranks are ready -> the last rank has it."""
    series: Series = {A: [], B: [], M: []}
    first: Series = {A: [], B: [], M: []}
    launcher_rc: dict[str, list[int]] = {A: [], B: [], M: []}
    for rep, which in alternate(reps, minimal=True):
        slot = ctx.slot("c-cancel", which, rep)
        launch = ctx.launch(which, nproc, slot, rank_target("waiter.py", str(slot)))
        if len(evidence(slot, "ready", nproc, timeout=60)) != nproc:
            launch.kill()
            raise BenchError(f"c: ranks not ready in {slot}")
        remember_ranks(slot, nproc)
        sent = time.time()
        os.kill(launch.pid, signal.SIGTERM)
        ended = launch.wait(90)
        got = evidence(slot, "term", nproc, timeout=0)
        if len(got) != nproc:
            raise BenchError(f"c: only ranks {sorted(got)} got SIGTERM in {slot}")
        times = [float(t) for t in got.values()]
        series[which].append(max(times) - sent)
        first[which].append(min(times) - sent)
        launcher_rc[which].append(ended.rc)
        no_leftovers(slot, nproc)
    progress(f"c  SIGTERM->last rank (N={nproc})", series, ms=True)
    return {"nproc": nproc, "series": series, "first_rank": first, "launcher_rc": launcher_rc}


def scenario_finish(ctx: Ctx, reps: int, nproc: int = 4) -> dict[str, Any]:
    """d. every rank exits 0 once all are ready -> the launcher process has ended."""
    series: Series = {A: [], B: [], M: []}
    for rep, which in alternate(reps, minimal=True):
        slot = ctx.slot("d-finish", which, rep)
        target = rank_target("waiter.py", str(slot), "--exit-ranks", "all")
        ended = ctx.launch(which, nproc, slot, target).wait(90)
        check_rc(which, ended, {0}, slot)
        exited = evidence(slot, "exit", nproc, timeout=0)
        if len(exited) != nproc:
            raise BenchError(f"d: missing exit evidence in {slot}")
        series[which].append(ended.end_time - max(float(t) for t in exited.values()))
        no_leftovers(slot, nproc)
    progress(f"d  last rank->launcher end (N={nproc})", series, ms=True)
    return {"nproc": nproc, "series": series}


def scenario_resources(ctx: Ctx, reps: int, nproc: int = 4, sleep: float = 3.0) -> dict[str, Any]:
    """e. launcher CPU and peak RSS for a run of ``nproc`` ranks sleeping ``sleep`` s."""
    keys = ("own_peak_mib", "own_cpu_s", "rusage_maxrss_mib", "rusage_cpu_s", "children_cpu_s",
            "wall_s")
    series: dict[str, dict[str, list[float]]] = {k: {A: [], B: []} for k in keys}
    for rep, which in alternate(reps):
        slot = ctx.slot("e-resources", which, rep)
        target = rank_target("waiter.py", str(slot), "--sleep", str(sleep))
        ended = ctx.launch(which, nproc, slot, target).wait(90, sample_rss=True)
        check_rc(which, ended, {0}, slot)
        values = {
            "own_peak_mib": (ended.own_peak_kib or 0) / 1024,
            "own_cpu_s": ended.own_cpu,
            "rusage_maxrss_mib": ended.rusage_maxrss_kib / 1024,
            "rusage_cpu_s": ended.rusage_cpu,
            "children_cpu_s": ended.children_cpu,
            "wall_s": ended.wall,
        }
        for key, value in values.items():
            series[key][which].append(value)
        no_leftovers(slot, nproc)
    progress("e  own peak RSS MiB", series["own_peak_mib"])
    progress("e  own CPU s", series["own_cpu_s"])
    return {"nproc": nproc, "sleep_s": sleep, "series": series}


@dataclass
class LineCount:
    expected: int
    valid: int = 0  # distinct (rank, line) pairs that arrived whole
    garbled: int = 0  # lines that are not a whole rank line (torn, merged, prefix mismatch)
    duplicates: int = 0
    per_rank: dict[int, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)  # a few bad lines, for the record

    @property
    def lost(self) -> int:
        return self.expected - self.valid

    def as_dict(self) -> dict[str, Any]:
        return {"expected": self.expected, "valid": self.valid, "lost": self.lost,
                "garbled": self.garbled, "duplicates": self.duplicates,
                "per_rank": self.per_rank, "examples": self.examples}


def count_lines(paths: Sequence[Path], pattern: re.Pattern[bytes], nranks: int,
                prefixed: bool, skip: Callable[[bytes], bool] = lambda _: False) -> LineCount:
    """Count whole rank lines; ``prefixed`` lines carry the launcher's rank prefix too."""
    count = LineCount(expected=nranks * FLOOD_LINES)
    seen: set[tuple[int, int]] = set()
    for path in paths:
        data = path.read_bytes() if path.exists() else b""
        for line in data.split(b"\n"):
            if not line or skip(line):
                continue
            match = pattern.fullmatch(line)
            if match is None or (prefixed and int(match[1]) != int(match[3])):
                count.garbled += 1
                if len(count.examples) < 5:
                    count.examples.append("garbled: " + line[:120].decode(errors="replace"))
                continue
            if prefixed:
                rank, index = int(match[1]), int(match[4])
            else:
                rank, index = int(match[1]), int(match[2])
            key = (rank, index)
            if key in seen:
                count.duplicates += 1
                if len(count.examples) < 5:
                    count.examples.append("duplicate: " + line[:120].decode(errors="replace"))
                continue
            seen.add(key)
            count.per_rank[rank] = count.per_rank.get(rank, 0) + 1
    count.valid = len(seen)
    return count


def scenario_flood(ctx: Ctx, reps: int) -> dict[str, Any]:
    """f. 8 ranks x 100k lines of 100 B: wall time and lines lost, per output mode."""
    modes = ("forgelm-tui", "torchrun --redirects 3", "torchrun --tee 3")
    walls: Series = {m: [] for m in modes}
    cpu: Series = {m: [] for m in modes}
    counts: dict[str, list[dict[str, Any]]] = {
        "forgelm-tui run-dir logs": [], "forgelm-tui stdout": [],
        "torchrun --redirects 3 logs": [], "torchrun --tee 3 stdout": [],
        "torchrun --tee 3 logs": [],
    }
    target = rank_target("flood.py", str(FLOOD_LINES))
    n = FLOOD_RANKS
    for rep in range(reps):
        for mode in modes:
            slot = ctx.slot("f-flood", mode.replace(" ", "").replace("--", "-"), rep)
            if mode == A:
                launch = ctx.launch(A, n, slot, target)
            else:
                flag = "--redirects" if "redirects" in mode else "--tee"
                launch = ctx.launch(B, n, slot, target, flag, "3", "--log-dir", str(slot / "logs"))
            ended = launch.wait(600)
            check_rc(mode, ended, {0}, slot)
            walls[mode].append(ended.wall)
            cpu[mode].append(ended.own_cpu)
            if mode == A:
                logs = [slot / "run" / f"rank-{r}.stdout.log" for r in range(n)]
                counts["forgelm-tui run-dir logs"].append(
                    count_lines(logs, PAYLOAD, n, False).as_dict())
                counts["forgelm-tui stdout"].append(count_lines(
                    [launch.stdout_path()], FTUI_LINE, n, True,
                    skip=lambda line: line.startswith(b"[forgelm-tui]")
                    or not line.startswith(b"[rank ")).as_dict())
            else:
                logs = sorted((slot / "logs").glob("*/attempt_*/*/stdout.log"))
                key = f"{mode} logs"
                counts[key].append(count_lines(logs, PAYLOAD, n, False).as_dict())
                if "tee" in mode:
                    counts["torchrun --tee 3 stdout"].append(count_lines(
                        [launch.stdout_path()], TEE_LINE, n, True).as_dict())
            tidy_flood(slot, launch, mode, counts)
        print(f"  f  rep {rep}: " + ", ".join(f"{m} {walls[m][-1]:.2f}s" for m in modes)
              + " | lost: " + ", ".join(f"{k} {v[-1]['lost']}" for k, v in counts.items()),
              flush=True)
    return {"ranks": n, "lines_per_rank": FLOOD_LINES, "line_bytes": 100, "wall": walls,
            "launcher_cpu": cpu, "counts": counts}


def tidy_flood(slot: Path, launch: Launch, mode: str,
               counts: dict[str, list[dict[str, Any]]]) -> None:
    """Keep the evidence of lines that went wrong, drop the ~80 MB copies that were whole."""

    def whole(key: str) -> bool:
        last = counts[key][-1] if counts[key] else None
        return last is None or last["lost"] == last["garbled"] == last["duplicates"] == 0

    logs_key, stdout_key = (
        ("forgelm-tui run-dir logs", "forgelm-tui stdout") if mode == A
        else (f"{mode} logs", "torchrun --tee 3 stdout")
    )
    if whole(logs_key):
        shutil.rmtree(slot / ("run" if mode == A else "logs"), ignore_errors=True)
    stdout_counted = mode in (A, "torchrun --tee 3")
    if not stdout_counted or whole(stdout_key):
        launch.stdout_path().unlink(missing_ok=True)


def scenario_orphans(ctx: Ctx, reps: int, nproc: int = 4, after: float = 2.0) -> dict[str, Any]:
    """g. every rank starts a child (sleep); SIGKILL the launcher; who is alive 2 s later."""
    rows: dict[str, list[dict[str, int]]] = {A: [], B: []}
    for rep, which in alternate(reps):
        slot = ctx.slot("g-orphans", which, rep)
        launch = ctx.launch(which, nproc, slot, rank_target("waiter.py", str(slot), "--child"))
        ready = evidence(slot, "ready", nproc, timeout=60)
        if len(ready) != nproc or any(len(t.split()) != 2 for t in ready.values()):
            launch.kill()
            raise BenchError(f"g: ranks not ready in {slot}")
        ranks = [Proc.of(int(t.split()[0])) for t in ready.values()]
        kids = [Proc.of(int(t.split()[1])) for t in ready.values()]
        rank_pids = {p.pid for p in ranks if p}
        others = [Proc.of(pid) for pid in children_of(launch.pid) if pid not in rank_pids]
        tracked = [p for p in (*ranks, *kids, *others) if p is not None]
        KNOWN.update(tracked)
        killed = time.monotonic()
        os.kill(launch.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            launch.wait(10)
        time.sleep(max(0.0, killed + after - time.monotonic()))
        row = {
            "ranks_alive": sum(1 for p in ranks if p is None or p.alive()),
            "children_alive": sum(1 for p in kids if p is None or p.alive()),
            "helpers_alive": sum(1 for p in others if p is not None and p.alive()),
            "helpers": len(others),
        }
        row["orphans"] = row["ranks_alive"] + row["children_alive"]
        rows[which].append(row)
        for proc in tracked:
            proc.kill()
    for which in (A, B):
        print(f"  g  {which}: orphans per run {[r['orphans'] for r in rows[which]]} "
              f"of {2 * nproc}", flush=True)
    return {"nproc": nproc, "after_s": after, "runs": rows}


# ------------------------------------------------------------------------- reporting


def stats(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def progress(title: str, series: Series, ms: bool = False) -> None:
    scale, unit = (1000.0, "ms") if ms else (1.0, "")
    parts = []
    for key, values in series.items():
        if values:
            s = stats(values)
            parts.append(f"{key} {s['median'] * scale:.3g}{unit} "
                         f"[{s['min'] * scale:.3g}-{s['max'] * scale:.3g}]")
    print(f"  {title}: " + "; ".join(parts), flush=True)


def fmt(value: float, scale: float, digits: int) -> str:
    return f"{value * scale:.{digits}f}"


def row(label: str, values: Sequence[float], scale: float, digits: int,
        ref: Sequence[float] | None) -> str:
    s = stats(values)
    ratio = "-"
    if ref:
        base = statistics.median(ref)
        ratio = f"{s['median'] / base:.3f}" if base else "-"
    return (f"| {label} | {fmt(s['median'], scale, digits)} | "
            f"{fmt(s['min'], scale, digits)}-{fmt(s['max'], scale, digits)} | {ratio} |")


def tables(results: dict[str, Any]) -> str:
    sc = results["scenarios"]
    out: list[str] = []
    head = "| launcher | median | min-max | ratio vs torchrun |\n|---|---|---|---|"
    if "a" in sc:
        out.append("### a. launch + teardown, no-op ranks (wall, s)\n")
        out.append("| N | launcher | median | min-max | ratio vs torchrun |\n|---|---|---|---|---|")
        for nproc, series in sc["a"].items():
            if not nproc.isdigit():
                continue
            for key in (A, B, M, "floor"):
                line = row(key if key != "floor" else f"floor: {nproc} x python noop.py",
                           series[key], 1, 3, series[B])
                out.append(f"| {nproc} {line}")
        out.append("\nCPU user+sys of the launcher process itself per no-op run (s, median):\n")
        out.append("| N | " + " | ".join((A, B, M)) + " |\n|---|---|---|---|")
        for nproc in [k for k in sc["a"] if k.isdigit()]:
            cpu = sc["a"].get(f"{nproc}-launcher-cpu", {})
            cells = [f"{statistics.median(cpu[w]):.2f}" if cpu.get(w) else "-" for w in (A, B, M)]
            out.append(f"| {nproc} | " + " | ".join(cells) + " |")
        out.append("")
    latency = (("b", "b. rank exit -> surviving peer has SIGTERM (ms)", "series"),
               ("c", "c. SIGTERM to the launcher -> last rank has it (ms)", "series"),
               ("d", "d. last rank ends -> launcher process ends (ms)", "series"))
    for key, title, field_name in latency:
        if key in sc:
            series = sc[key][field_name]
            out.append(f"### {title}\n")
            out.append(head)
            for which in (A, B, M):
                out.append(row(which, series[which], 1000, 2, series[B]))
            if key == "c":
                first = sc[key]["first_rank"]
                for which in (A, B, M):
                    out.append(row(f"{which} (first rank)", first[which], 1000, 2, first[B]))
            out.append("")
    if "e" in sc:
        e = sc["e"]
        out.append(f"### e. launcher resources, {e['nproc']} ranks sleeping {e['sleep_s']:g} s\n")
        out.append("| measure | launcher | median | min-max | ratio vs torchrun |\n"
                   "|---|---|---|---|---|")
        labels = {
            "own_peak_mib": "peak RSS of the launcher process itself (VmHWM), MiB",
            "own_cpu_s": "CPU user+sys of the launcher process itself, s",
            "rusage_maxrss_mib": "wait4 ru_maxrss (launcher + reaped children), MiB",
            "rusage_cpu_s": "wait4 CPU user+sys (launcher + reaped children), s",
            "children_cpu_s": "CPU of its reaped children (ranks, guardian), s",
            "wall_s": "wall, s",
        }
        for key, label in labels.items():
            series = e["series"][key]
            for which in (A, B):
                out.append(f"| {label} {row(which, series[which], 1, 3, series[B])}")
        out.append("")
    if "f" in sc:
        f = sc["f"]
        out.append(f"### f. log flood: {f['ranks']} ranks x {f['lines_per_rank']} lines of "
                   f"{f['line_bytes']} B (wall, s)\n")
        out.append(head)
        ref = f["wall"]["torchrun --redirects 3"]
        for mode, values in f["wall"].items():
            out.append(row(mode, values, 1, 2, ref))
        out.append("\nCPU user+sys of the launcher process itself (s):\n")
        out.append(head)
        cref = f["launcher_cpu"]["torchrun --redirects 3"]
        for mode, values in f["launcher_cpu"].items():
            out.append(row(mode, values, 1, 2, cref))
        out.append("\n| where the lines were counted | lost per run | garbled | duplicates |\n"
                   "|---|---|---|---|")
        for where, runs in f["counts"].items():
            out.append(f"| {where} | {[r['lost'] for r in runs]} | "
                       f"{[r['garbled'] for r in runs]} | {[r['duplicates'] for r in runs]} |")
        out.append("")
    if "g" in sc:
        g = sc["g"]
        out.append(f"### g. orphans: {g['nproc']} ranks + {g['nproc']} children, launcher "
                   f"SIGKILLed, checked {g['after_s']:g} s later\n")
        out.append("| launcher | orphans alive per run (ranks + children) | ranks alive | "
                   "children alive | other launcher children alive |\n|---|---|---|---|---|")
        for which in (A, B):
            runs = g["runs"][which]
            out.append(f"| {which} | {[r['orphans'] for r in runs]} | "
                       f"{[r['ranks_alive'] for r in runs]} | "
                       f"{[r['children_alive'] for r in runs]} | "
                       f"{[r['helpers_alive'] for r in runs]} |")
        out.append("")
    return "\n".join(out)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    sc = results["scenarios"]
    found: list[dict[str, Any]] = []

    def add(name: str, goal: str, measured: str, ok: bool) -> None:
        found.append({"target": name, "goal": goal, "measured": measured,
                      "result": "pass" if ok else "MISS"})

    med = statistics.median
    if "a" in sc and "8" in sc["a"]:
        s = sc["a"]["8"]
        ratio = med(s[A]) / med(s[B])
        floor = med(s["floor"]) / med(s[B])
        add("no-op launch+teardown, N=8", "<= 0.16x torchrun (issue 19; floor ~0.07x)",
            f"{ratio:.3f}x ({med(s[A]):.3f} s vs {med(s[B]):.3f} s; floor {floor:.3f}x)",
            ratio <= 0.16)
    if "b" in sc:
        s = sc["b"]["series"]
        floor = med(s[M]) if s.get(M) else float("inf")
        add("rank exit -> peers signalled",
            "<= 2 ms median and <= 1.3x the minimal launcher's (issue 19)",
            f"{med(s[A]) * 1000:.2f} ms, {med(s[A]) / floor:.2f}x the minimal launcher's "
            f"{floor * 1000:.2f} ms (torchrun {med(s[B]) * 1000:.1f} ms)",
            med(s[A]) <= 0.002 and med(s[A]) <= 1.3 * floor)
    if "d" in sc:
        s = sc["d"]["series"]
        add("last rank ends -> supervisor exits", "<= 12 ms (issue 19; torchrun 500-1000 ms)",
            f"{med(s[A]) * 1000:.1f} ms (torchrun {med(s[B]) * 1000:.0f} ms)",
            med(s[A]) <= 0.012)
    if "e" in sc:
        s = sc["e"]["series"]
        own = med(s["own_peak_mib"][A])
        add("supervisor peak RSS, headless", "<= 26 MiB (issue 19; torchrun 211 MiB)",
            f"{own:.1f} MiB launcher itself (torchrun {med(s['own_peak_mib'][B]):.0f} MiB); "
            f"wait4 ru_maxrss {med(s['rusage_maxrss_mib'][A]):.1f} MiB", own <= 26)
    if "f" in sc:
        w = sc["f"]["wall"]
        ftui, ref = med(w[A]), med(w["torchrun --redirects 3"])
        add("log flood wall", "no worse than torchrun --redirects",
            f"{ftui:.2f} s vs {ref:.2f} s ({ftui / ref:.2f}x)", ftui <= ref)
        lost = {k: [r["lost"] + r["garbled"] for r in v] for k, v in sc["f"]["counts"].items()}
        ftui_lost = {k: v for k, v in lost.items() if k.startswith(A)}
        add("0 lines lost in every mode (forgelm-tui)", "0 lost, 0 garbled (lost+garbled per run)",
            "; ".join(f"{k}: {v}" for k, v in lost.items()),
            all(x == 0 for v in ftui_lost.values() for x in v))
    if "g" in sc:
        runs = sc["g"]["runs"][A]
        add("0 orphans (forgelm-tui SIGKILLed)", "0",
            f"{[r['orphans'] for r in runs]} (torchrun "
            f"{[r['orphans'] for r in sc['g']['runs'][B]]})",
            all(r["orphans"] == 0 for r in runs))
    return found


def targets_table(found: list[dict[str, Any]]) -> str:
    lines = ["| target | goal | measured | result |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['goal']} | {t['measured']} | {t['result']} |" for t in found]
    return "\n".join(lines)


def torch_default_monitor_interval() -> str | None:
    """torchrun's default --monitor-interval, read from torch's source (no torch import)."""
    out = subprocess.run([PYTHON, "-c", "import importlib.util as u; "
                          "print(u.find_spec('torch').submodule_search_locations[0])"],
                         capture_output=True, text=True, timeout=60)
    path = Path(out.stdout.strip()) / "distributed" / "launcher" / "api.py"
    with contextlib.suppress(OSError):
        match = re.search(r"monitor_interval: float = ([\d.]+)", path.read_text())
        if match:
            return match[1]
    return None


def meta(args: argparse.Namespace) -> dict[str, Any]:
    def version(code: str) -> str:
        out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
        return out.stdout.strip() or out.stderr.strip().splitlines()[-1]

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "forgelm_tui"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "nproc": os.cpu_count(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": version("import torch; print(torch.__version__)"),
        "psutil": version("import psutil; print(psutil.__version__)"),
        "forgelm_tui": version("import forgelm_tui; print(forgelm_tui.__version__)"),
        "commit": commit + (" (forgelm_tui modified)" if dirty else ""),
        "torchrun_monitor_interval_default_s": torch_default_monitor_interval(),
        "reps": args.reps,
        "flood_reps": args.flood_reps,
        "quick": args.quick,
        "mem_total_mib": _mem_total_mib(),
        "sched_autogroup": _read("/proc/sys/kernel/sched_autogroup_enabled"),
    }


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]  # total, idle + iowait


def _proc_cpu() -> dict[int, tuple[int, str]]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{name}/stat", "rb") as handle:
                    data = handle.read()
                fields = data[data.rindex(b")") + 2 :].split()
                comm = data[data.index(b"(") + 1 : data.rindex(b")")].decode(errors="replace")
                found[int(name)] = (int(fields[11]) + int(fields[12]), comm)
    return found


def machine_load(seconds: float = 1.0) -> dict[str, Any]:
    """How busy the machine is while the bench itself is idle: other work skews every number."""
    total0, idle0 = _cpu_times()
    procs0 = _proc_cpu()
    time.sleep(seconds)
    total1, idle1 = _cpu_times()
    procs1 = _proc_cpu()
    busy = 1 - (idle1 - idle0) / max(1, total1 - total0)
    others = []
    for pid, (ticks, comm) in procs1.items():
        if pid in procs0 and pid != os.getpid():
            share = (ticks - procs0[pid][0]) / CLK_TCK / seconds
            if share >= 0.05:
                with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as handle:
                    comm = handle.read().replace(b"\0", b" ").decode(errors="replace")[:160]
                others.append({"pid": pid, "cpu": round(share, 2), "cmd": comm.strip()})
    return {"loadavg": [round(x, 2) for x in os.getloadavg()],
            "busy_cpus": round(busy * (os.cpu_count() or 1), 2),
            "busy_processes": sorted(others, key=lambda o: -o["cpu"])}


def wait_quiet(ceiling: float, patience: float) -> dict[str, Any]:
    """Wait up to ``patience`` s for fewer than ``ceiling`` CPUs busy; returns the last probe."""
    deadline = time.monotonic() + patience
    while True:
        load = machine_load()
        if load["busy_cpus"] < ceiling or time.monotonic() >= deadline:
            return load
        time.sleep(4.0)


def _read(path: str) -> str | None:
    with contextlib.suppress(OSError), open(path) as handle:
        return handle.read().strip()
    return None


def _mem_total_mib() -> int | None:
    with contextlib.suppress(OSError), open("/proc/meminfo") as handle:
        return int(handle.readline().split()[1]) // 1024
    return None


# ------------------------------------------------------------------------- main


def warm_up(ctx: Ctx) -> None:
    """forgelm_tui's .pyc files written (as a wheel install has them; an editable install in an
    environment with PYTHONDONTWRITEBYTECODE would otherwise compile every module at every
    launch: 0.174x against 0.150x torchrun's no-op, session 7), then one untimed run of each
    launcher, so the page cache is warm."""
    import compileall

    compileall.compile_dir(str(ROOT / "forgelm_tui"), quiet=1)
    for which in (A, B):
        slot = ctx.slot("warmup", which, 0)
        ctx.launch(which, 2, slot, rank_target("noop.py")).wait(120)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions (2 for a-e, 1 for f-g): about 2-3 minutes")
    parser.add_argument("--reps", type=int, default=None,
                        help="repetitions per launcher for a-e (default 7; 2 with --quick)")
    parser.add_argument("--flood-reps", type=int, default=None,
                        help="repetitions for f and g (default 3; 1 with --quick)")
    parser.add_argument("--quiet-cpus", type=float, default=0.5,
                        help="before each scenario wait for fewer CPUs than this busy (0.5)")
    parser.add_argument("--quiet-wait", type=float, default=None,
                        help="... but for at most this many seconds, then go on (30; 5 quick)")
    parser.add_argument("--only", default="a,b,c,d,e,f,g", help="scenarios to run, e.g. b,d")
    parser.add_argument("--out", type=Path, default=None,
                        help="where launcher output and run dirs go (default bench/out/TIME)")
    parser.add_argument("--json", type=Path, default=None,
                        help="raw results (default bench/results.json; the out dir with --quick)")
    args = parser.parse_args(argv)
    args.reps = args.reps or (2 if args.quick else 7)
    args.flood_reps = args.flood_reps or (1 if args.quick else 3)
    if args.quiet_wait is None:
        args.quiet_wait = 5.0 if args.quick else 30.0
    only = set(args.only.split(","))
    out = (args.out or BENCH / "out" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or (out / "results.json" if args.quick else BENCH / "results.json")

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    ctx = Ctx(out)
    results: dict[str, Any] = {"meta": meta(args), "scenarios": {}}
    print(f"bench: out {out}; reps {args.reps} (f, g: {args.flood_reps})", flush=True)
    started = time.monotonic()
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("a", lambda: scenario_launch(ctx, args.reps, (2, 4, 8))),
        ("b", lambda: scenario_peer(ctx, args.reps)),
        ("c", lambda: scenario_cancel(ctx, args.reps)),
        ("d", lambda: scenario_finish(ctx, args.reps)),
        ("e", lambda: scenario_resources(ctx, args.reps)),
        ("f", lambda: scenario_flood(ctx, args.flood_reps)),
        ("g", lambda: scenario_orphans(ctx, args.flood_reps)),
    ]
    try:
        warm_up(ctx)
        for key, step in steps:
            if key in only:
                load = wait_quiet(args.quiet_cpus, args.quiet_wait)
                print(f"  load before {key}: {load['busy_cpus']} of {os.cpu_count()} CPUs busy "
                      f"(loadavg {load['loadavg'][0]})", flush=True)
                results["scenarios"][key] = step()
                results["scenarios"][key]["load_before"] = load
                leftovers = kill_leftovers()
                if leftovers:
                    results["scenarios"][key]["leftovers_killed"] = leftovers
    finally:
        killed = kill_leftovers()
        if killed:
            print(f"bench: killed {killed} leftover process(es)", file=sys.stderr)
    results["meta"]["bench_seconds"] = round(time.monotonic() - started, 1)
    results["targets"] = targets(results)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    if json_path.resolve() != (out / "results.json"):
        (out / "results.json").write_text(json_path.read_text())
    text = tables(results) + "\n### targets\n\n" + targets_table(results["targets"]) + "\n"
    (out / "tables.md").write_text(text)
    print("\n" + text)
    print(f"bench: {results['meta']['bench_seconds']} s; raw numbers in {json_path}; "
          f"tables in {out / 'tables.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
