"""Soak: many runs of many torch-free ranks with random faults, and a long memory run.

    /work/main/.venv/bin/python bench/soak.py                     # 100 runs x 64 ranks + 2 x 10 min
    /work/main/.venv/bin/python bench/soak.py --quick             # 3 runs x 8 ranks + 2 x 0.5 min
    /work/main/.venv/bin/python bench/soak.py --only faults --runs 20 --ranks 32 --seed 7

Faults (issue 12, item 10). Each run: forgelm-tui ``--no-tui`` over ``bench/ranks/soak_rank.py``
with a plan drawn from ``--seed`` and the run's number (so a run can be replayed: ``--seed S
--first-run I --runs 1``). Every rank writes a deterministic byte stream to stdout and stderr
(``bench/ranks/soak_stream.py``: numbered lines with a CRC, ``\\r`` updates, lines without a
newline, binary bytes, long lines; some ranks flood MiBs), then acts: exit 0 or an outcome code
(3-6), fail (exit 1, 2, 7, 42, 255; an uncaught RuntimeError; a signal to itself: SIGKILL,
SIGSEGV, SIGABRT, SIGBUS, ..., any real-time signal), or go on until stopped (sleep, flood, a
SIGSTOP, with SIGTERM ignored or not). Some ranks start a daemon first (``sleep 3600`` in a new
session, or a double fork, or a new session that keeps the rank's stdout/stderr pipes).
Actions wait at a gate (a FIFO the bench opens once every rank has written its planned bytes),
except "early" failures, which strike while the others still write.

Checked after every run:

- lost bytes and lines: each rank counts the bytes the kernel accepted in an mmap'ed file
  (kept when it is SIGKILLed); its ``stdout_log`` / ``stderr_log`` (envelope ``ranks[]``) must
  be exactly its stream up to at least that count (a traceback may follow on stderr of a rank
  that raised). A byte that differs is a corrupt stream, a shortfall is lost lines;
- surviving processes: ``--settle`` s (2) after the supervisor ended, every process whose
  environment holds this run's ``TORCHELASTIC_RUN_ID``: counted (rank, daemon, other), then
  SIGKILLed by the bench;
- supervisor exceptions: "Traceback" in its stderr, or a line of its stdout starting with it
  (rank output is prefixed ``[rank N]``); a run that did not end within ``--timeout`` s;
- the exit code: in the contract (0..6 under ``forgelm``), not 0 when a rank failed, and in
  the set SPEC section 5 predicts: the mapped code of one of the failing ranks (the earliest
  failure is timing, so any of them), else rank 0's own code. ``raise`` is 2 under
  ``forgelm`` (a crash, SPEC 5 / issue 12 item 3), 1 under ``raw``; a signal 2, or 128+N;
- the envelope: written, final, its ``exit_code`` the process's; a rank that died of its own
  signal has it named, a rank that exited on its own has its code.

Memory: 64 ranks (``--mem-ranks``) printing their streams at ``--print-rate`` records/s each
for ``--minutes`` (10), against a baseline run of 64 silent ranks of the same length; the
supervisor's RSS (psutil) and VmHWM every second. Budget (README "Memory", as
tests/test_memory.py computes it): 1 MiB per rank for the engine + the headless stdout buffer
(at most 64 MiB, never more than what was printed) + 4 MiB of interpreter slack, over the
baseline's peak. Each rank's log is checked against its own byte count and CRC.

Results: a line per run, then tables (OUT/tables.md) and the raw numbers in bench/soak.json
(with --quick: the out dir). Slots of clean runs are deleted (floods are MiBs); runs with a
finding keep everything under bench/out/soak-TIME/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import select
import shutil
import signal
import statistics
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "ranks"))

import run as suite  # (bench/run.py: processes, load probes)
import soak_stream  # (bench/ranks/soak_stream.py: the ranks' byte streams)
from run import BENCH, Launch, Proc

OUTCOMES = {0, 3, 4, 5, 6}
FAIL_EXITS = (1, 2, 7, 42, 255)
FAIL_SIGNALS = (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE,
                signal.SIGILL, signal.SIGTRAP, signal.SIGSYS, signal.SIGXCPU, signal.SIGUSR1,
                signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM,
                signal.SIGPIPE)
RT_SIGNALS = tuple(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
DAEMONS = ("session", "double_fork", "session_keeps_pipes")
MIB = 1 << 20


# ------------------------------------------------------------------------- plans


def signame(num: int) -> str:
    """As ``kill -l`` names it: SIGRTMIN, SIGRTMIN+1..15, SIGRTMAX-14..1, SIGRTMAX."""
    low, high = signal.SIGRTMIN, signal.SIGRTMAX
    if low <= num <= high:
        if num in (low, high):
            return "SIGRTMIN" if num == low else "SIGRTMAX"
        if num - low <= (high - low) // 2:
            return f"SIGRTMIN+{num - low}"
        return f"SIGRTMAX-{high - num}"
    return signal.Signals(num).name


def make_plan(seed: int, run: int, world: int, flood_bytes: int) -> dict[str, Any]:
    """The run's faults, drawn from (seed, run) alone."""
    rng = random.Random(f"soak/{seed}/{run}")
    contract = "raw" if rng.random() < 0.2 else "forgelm"
    ranks: list[dict[str, Any]] = []
    for _ in range(world):
        size = rng.random()
        if size < 0.15:  # a flood, mostly of short lines
            out, err = rng.randrange(flood_bytes // 8, flood_bytes), rng.randrange(0, 64 << 10)
        elif size < 0.85:
            out, err = rng.randrange(0, 32 << 10), rng.randrange(0, 4 << 10)
        else:
            out = err = 0
        ranks.append({"out": out, "err": err, "dense": size < 0.15 and rng.random() < 0.7,
                      "early": False, "ignore_term": False,
                      "daemon": rng.choice(DAEMONS) if rng.random() < 0.06 else None,
                      "action": "exit", "arg": 0})
    failing = rng.sample(range(world), min(world, rng.choices((0, 1, 2, 3), (3, 4, 2, 1))[0]))
    for rank in failing:
        ranks[rank].update(failure(rng))
        ranks[rank]["early"] = rng.random() < 0.3
    for rank, me in enumerate(ranks):
        if rank in failing:
            continue
        if rng.random() < (0.3 if rank == 0 else 0.05):
            me["arg"] = rng.choice((3, 4, 5, 6))
        # Something that never ends by itself: only where a failure, or rank 0's end (then
        # the drain window), stops it.
        if (failing or rank != 0) and rng.random() < (0.12 if failing else 0.03):
            me["action"] = rng.choice(("hang", "hang", "flood", "stop"))
            me["ignore_term"] = me["action"] != "stop" and rng.random() < 0.3
    return {"seed": seed, "run": run, "world": world, "contract": contract, "ranks": ranks}


def failure(rng: random.Random) -> dict[str, Any]:
    kind = rng.random()
    if kind < 0.35:
        return {"action": "exit", "arg": rng.choice(FAIL_EXITS)}
    if kind < 0.5:
        return {"action": "raise", "arg": None}
    pool = RT_SIGNALS if rng.random() < 0.5 else FAIL_SIGNALS
    return {"action": "signal", "arg": int(rng.choice(pool))}


def failure_code(me: dict[str, Any], contract: str) -> int | None:
    """What SPEC section 5 makes of this rank ending on its own; None: not a failure."""
    action, arg = me["action"], me["arg"]
    if action == "exit":
        if arg in OUTCOMES:
            return None
        return arg if contract == "raw" or arg <= 6 else 2
    if action == "raise":
        return 1 if contract == "raw" else 2
    if action == "signal":
        return 128 + arg if contract == "raw" else 2
    return None


def expected_codes(plan: dict[str, Any]) -> set[int]:
    codes = {failure_code(me, plan["contract"]) for me in plan["ranks"]} - {None}
    return {c for c in codes if c is not None} or {plan["ranks"][0]["arg"]}


def describe(plan: dict[str, Any]) -> tuple[str, str]:
    """(failures, other faults) in a few words."""
    fails, other = [], []
    for rank, me in enumerate(plan["ranks"]):
        if failure_code(me, plan["contract"]) is not None:
            what = (f"exit {me['arg']}" if me["action"] == "exit" else "raise"
                    if me["action"] == "raise" else signame(me["arg"]))
            fails.append(f"r{rank} {what}{' early' if me['early'] else ''}")
        elif me["action"] != "exit":
            other.append(f"r{rank} {me['action']}{' ign-TERM' if me['ignore_term'] else ''}")
        if me["daemon"]:
            other.append(f"r{rank} daemon:{me['daemon']}")
    return ", ".join(fails) or "-", ", ".join(other) or "-"


# ------------------------------------------------------------------------- processes


def with_run_id(run_id: str) -> list[int]:
    """Every process whose environment holds TORCHELASTIC_RUN_ID=run_id (zombies have none)."""
    needle = f"\0TORCHELASTIC_RUN_ID={run_id}\0".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as handle:
                if needle in b"\0" + handle.read() + b"\0":
                    found.append(int(name))
    return found


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    return "?"


def launch(argv: list[str], slot: Path, env: dict[str, str]) -> Launch:
    return Launch(argv, slot / "supervisor", cwd=slot, env=env)


def supervisor_argv(nproc: int, slot: Path, extra: Sequence[str],
                    target: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "forgelm_tui", "--no-tui", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(suite.free_port()),
            "--run-dir", str(slot / "run"), *extra, *target]


def read_envelope(slot: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        found: dict[str, Any] = json.loads((slot / "run" / "envelope.json").read_text())
        return found
    return None


def find_run_id(slot: Path, envelope: dict[str, Any] | None) -> str | None:
    if envelope and envelope.get("run_id"):
        return str(envelope["run_id"])
    with contextlib.suppress(OSError):
        match = re.search(rb"\] run (\S+):", (slot / "supervisor.stdout").read_bytes()[:4096])
        if match:
            return match[1].decode()
    return None


# ------------------------------------------------------------------------- one fault run


def run_faults_once(args: argparse.Namespace, env: dict[str, str], out: Path,
                    run: int) -> dict[str, Any]:
    plan = make_plan(args.seed, run, args.ranks, int(args.flood_mib * MIB))
    slot = out / "faults" / f"run-{run:03d}"
    slot.mkdir(parents=True)
    (slot / "plan.json").write_text(json.dumps(plan))
    os.mkfifo(slot / "gate")
    gate = os.open(slot / "gate", os.O_RDWR)  # held: a rank's O_RDONLY open never blocks
    extra = ["--grace", str(args.grace), "--drain", str(args.drain),
             "--exit-contract", plan["contract"]]
    sup = launch(supervisor_argv(args.ranks, slot, extra,
                                 [str(suite.RANKS / "soak_rank.py"), str(slot)]), slot, env)
    try:
        gated, hung = watch(sup, slot, args.ranks, gate, args.timeout)
        if hung:
            sup.kill()  # SIGKILL, with everything under it; escaped daemons are counted below
            rc, wall, end_time = sup.proc.returncode, time.perf_counter() - sup.t0, time.time()
        else:
            ended = sup.wait(10)
            rc, wall, end_time = ended.rc, ended.wall, ended.end_time
    finally:
        sup.kill()
        os.close(gate)
    settle_until = end_time + args.settle
    envelope = read_envelope(slot)
    run_id = find_run_id(slot, envelope)
    time.sleep(max(0.0, settle_until - time.time()))
    result = {"run": run, "contract": plan["contract"], "rc": rc, "wall_s": round(wall, 3),
              "gate_opened": gated, "supervisor_hung": hung, "run_id": run_id,
              "expected": sorted(expected_codes(plan)), "plan": describe(plan)}
    result["survivors"] = survivors(slot, run_id, envelope)
    result["streams"] = check_streams(slot, plan, envelope)
    result.update(check_supervisor(slot, plan, rc, envelope))
    result["clean"] = is_clean(result)
    if result["clean"] and not args.keep:
        shutil.rmtree(slot, ignore_errors=True)
    else:
        (slot / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        if not result["streams"]["corrupt"] and not args.keep:  # MiBs that showed nothing
            for log in (slot / "run").glob("rank-*.log"):
                log.unlink()
            if not result["tracebacks"]:
                (slot / "supervisor.stdout").unlink()
    return result


def watch(sup: Launch, slot: Path, nproc: int, gate: int, timeout: float) -> tuple[bool, bool]:
    """Until the supervisor ends: open the gate once every rank is ready. (gated, hung)."""
    poller = select.poll()
    poller.register(sup.pidfd, select.POLLIN)
    deadline, gated = time.monotonic() + timeout, False
    while not poller.poll(50):
        if time.monotonic() > deadline:
            return gated, True
        if not gated and sum(n.startswith("ready-") for n in os.listdir(slot)) >= nproc:
            os.write(gate, b"g" * nproc)
            gated = True
    return gated, False


def survivors(slot: Path, run_id: str | None, envelope: dict[str, Any] | None) -> dict[str, Any]:
    """Processes of this run still alive after the settle time; SIGKILLed here."""
    if run_id is None:
        return {"error": "no run id (no envelope, no first line)", "count": 0}
    ranks = {r.get("pid") for r in (envelope or {}).get("ranks", [])}
    daemons = set()
    for path in slot.glob("daemon-*"):
        with contextlib.suppress(ValueError, OSError):
            daemons.add(int(path.read_text()))
    found: dict[str, Any] = {"count": 0, "ranks": 0, "daemons": 0, "other": 0, "processes": []}
    for pid in with_run_id(run_id):
        kind = "ranks" if pid in ranks else "daemons" if pid in daemons else "other"
        found[kind] += 1
        found["count"] += 1
        found["processes"].append({"pid": pid, "kind": kind, "cmd": cmdline(pid)})
        proc = Proc.of(pid)
        if proc is not None:
            proc.kill()
    return found


# ------------------------------------------------------------------------- checks


def check_streams(slot: Path, plan: dict[str, Any], envelope: dict[str, Any] | None
                  ) -> dict[str, Any]:
    logs = {r["rank"]: r for r in (envelope or {}).get("ranks", [])}
    total: dict[str, Any] = {"lines_written": 0, "bytes_written": 0, "lost_lines": 0,
                             "lost_bytes": 0, "corrupt": [], "unrecorded_tail_bytes": 0}
    for rank, me in enumerate(plan["ranks"]):
        recorded = (0, 0)
        with contextlib.suppress(OSError):
            data = (slot / f"count-{rank}").read_bytes()
            recorded = (int.from_bytes(data[:8], "little"), int.from_bytes(data[8:16], "little"))
        for i, stream in enumerate(("out", "err")):
            path = Path(logs.get(rank, {}).get(f"std{stream}_log")
                        or slot / "run" / f"rank-{rank}.std{stream}.log")
            key = soak_stream.stream_key(plan["seed"], plan["run"], rank, stream,
                                         me["dense"] and stream == "out")
            found = check_log(path, key, recorded[i], me["action"] == "raise" and i == 1)
            total["lines_written"] += found["lines"]
            total["bytes_written"] += recorded[i]
            total["lost_lines"] += found["lost_lines"]
            total["lost_bytes"] += found["lost_bytes"]
            total["unrecorded_tail_bytes"] += found["unrecorded"]
            if found["corrupt_at"] is not None or found["lost_bytes"]:
                total["corrupt"].append({"rank": rank, "stream": stream, **found})
    return total


def check_log(path: Path, key: str, recorded: int, traceback_may_follow: bool) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    expected = soak_stream.prefix(key, max(len(data), recorded))
    good = len(data) if data == expected[: len(data)] else first_difference(data, expected)
    corrupt_at: int | None = None
    if good < len(data):
        allowed = traceback_may_follow and good >= recorded and b"Traceback" in data[good:]
        corrupt_at = None if allowed else good
    lost = max(0, recorded - good)
    return {"path": str(path), "recorded": recorded, "in_log": len(data),
            "lines": expected[:recorded].count(b"\n"), "lost_bytes": lost,
            "lost_lines": expected[good:recorded].count(b"\n"),
            "unrecorded": max(0, min(good, len(data)) - recorded), "corrupt_at": corrupt_at}


def first_difference(a: bytes, b: bytes) -> int:
    size = min(len(a), len(b))
    step = 1 << 16
    for start in range(0, size, step):
        if a[start : start + step] != b[start : start + step]:
            for i in range(start, min(size, start + step)):
                if a[i] != b[i]:
                    return i
    return size


def check_supervisor(slot: Path, plan: dict[str, Any], rc: int,
                     envelope: dict[str, Any] | None) -> dict[str, Any]:
    stderr = (slot / "supervisor.stderr").read_bytes()
    tracebacks = stderr.count(b"Traceback")
    with open(slot / "supervisor.stdout", "rb") as handle:
        tracebacks += sum(1 for line in handle if line.startswith(b"Traceback"))
    contract_ok = 0 <= rc <= 6 if plan["contract"] == "forgelm" else 0 <= rc <= 255
    failing = any(failure_code(me, plan["contract"]) is not None for me in plan["ranks"])
    problems = envelope_problems(plan, rc, envelope)
    return {"tracebacks": tracebacks, "stderr_tail": stderr.decode(errors="replace")[-600:],
            "code_in_contract": contract_ok, "failing_ranks": failing,
            "zero_despite_failure": failing and rc == 0,
            "code_as_predicted": rc in expected_codes(plan),
            "decided_by": (envelope or {}).get("decided_by"), "envelope_problems": problems}


def envelope_problems(plan: dict[str, Any], rc: int, envelope: dict[str, Any] | None
                      ) -> list[str]:
    if envelope is None:
        return ["no envelope"]
    problems = []
    if envelope.get("provisional"):
        problems.append("final envelope is provisional")
    if envelope.get("exit_code") != rc:
        problems.append(f"envelope exit_code {envelope.get('exit_code')} != process {rc}")
    for record in envelope.get("ranks", []):
        me = plan["ranks"][record["rank"]]
        if record.get("signalled_by_supervisor"):
            continue
        if me["action"] == "signal" and record.get("signal") != signame(me["arg"]):
            problems.append(f"rank {record['rank']} died of {signame(me['arg'])}: envelope says "
                            f"signal {record.get('signal')!r}, exit {record.get('exit_code')}")
        if me["action"] == "exit" and record.get("exit_code") != me["arg"]:
            problems.append(f"rank {record['rank']} exited {me['arg']}: envelope says "
                            f"{record.get('exit_code')!r} / {record.get('signal')!r}")
    return problems


def is_clean(result: dict[str, Any]) -> bool:
    return (not result["supervisor_hung"] and result["tracebacks"] == 0
            and result["code_in_contract"] and not result["zero_despite_failure"]
            and result["code_as_predicted"] and not result["envelope_problems"]
            and result["survivors"].get("count", 0) == 0 and "error" not in result["survivors"]
            and not result["streams"]["corrupt"])


def faults(args: argparse.Namespace, env: dict[str, str], out: Path) -> dict[str, Any]:
    runs = []
    print(f"faults: {args.runs} runs x {args.ranks} ranks, seed {args.seed}, grace {args.grace} s, "
          f"drain {args.drain} s", flush=True)
    for run in range(args.first_run, args.first_run + args.runs):
        result = run_faults_once(args, env, out, run)
        runs.append(result)
        s, st = result["survivors"], result["streams"]
        flags = [] if result["clean"] else ["FINDING"]
        if not result["code_as_predicted"]:
            flags.append(f"decided_by {result['decided_by']}")
        print(f"  run {run:3d} [{len(runs)}/{args.runs}] {result['contract']:7s} "
              f"rc {result['rc']} (expected {result['expected']}) {result['wall_s']:.1f} s; "
              f"lines {st['lines_written']}, lost {st['lost_lines']}, corrupt "
              f"{len(st['corrupt'])}; survivors {s.get('count')} (daemons {s.get('daemons')}, "
              f"ranks {s.get('ranks')}, other {s.get('other')}); tracebacks "
              f"{result['tracebacks']}; fails: {result['plan'][0]}; other: {result['plan'][1]}"
              f"{'  ' + ' '.join(flags) if flags else ''}", flush=True)
    return {"runs": runs, "totals": fault_totals(runs)}


def fault_totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [r["wall_s"] for r in runs]
    return {
        "runs": len(runs),
        "clean_runs": sum(r["clean"] for r in runs),
        "lines_written": sum(r["streams"]["lines_written"] for r in runs),
        "bytes_written": sum(r["streams"]["bytes_written"] for r in runs),
        "lost_lines": sum(r["streams"]["lost_lines"] for r in runs),
        "lost_bytes": sum(r["streams"]["lost_bytes"] for r in runs),
        "corrupt_streams": sum(len(r["streams"]["corrupt"]) for r in runs),
        "survivors": sum(r["survivors"].get("count", 0) for r in runs),
        "surviving_daemons": sum(r["survivors"].get("daemons", 0) for r in runs),
        "surviving_ranks": sum(r["survivors"].get("ranks", 0) for r in runs),
        "surviving_other": sum(r["survivors"].get("other", 0) for r in runs),
        "runs_with_survivors": sum(bool(r["survivors"].get("count")) for r in runs),
        "supervisor_tracebacks": sum(r["tracebacks"] for r in runs),
        "supervisor_hung": sum(r["supervisor_hung"] for r in runs),
        "codes_outside_contract": sum(not r["code_in_contract"] for r in runs),
        "zero_despite_failure": sum(r["zero_despite_failure"] for r in runs),
        "code_not_as_predicted": sum(not r["code_as_predicted"] for r in runs),
        "envelope_problems": sum(len(r["envelope_problems"]) for r in runs),
        "codes": {str(c): sum(r["rc"] == c for r in runs) for c in sorted({r["rc"] for r in runs})},
        "wall_s_median": round(statistics.median(walls), 2) if walls else None,
        "wall_s_max": round(max(walls), 2) if walls else None,
    }


# ------------------------------------------------------------------------- memory


def memory(args: argparse.Namespace, env: dict[str, str], out: Path) -> dict[str, Any]:
    seconds = args.minutes * 60
    print(f"memory: {args.mem_ranks} ranks x {seconds:.0f} s, silent then printing "
          f"{args.print_rate:g} records/s per rank", flush=True)
    found = {mode: memory_run(args, env, out, mode, seconds) for mode in ("silent", "printing")}
    base, load = found["silent"], found["printing"]
    printed = load["supervisor_stdout_bytes"]
    budget = args.mem_ranks * MIB + min(64 * MIB, printed) + 4 * MIB
    verdict = {
        "budget_bytes": budget,
        "budget_formula": "ranks x 1 MiB (engine) + min(64 MiB headless buffer, printed) + 4 MiB",
        "peak_difference_bytes": load["peak_bytes"] - base["peak_bytes"],
        "final_difference_bytes": load["final_bytes"] - base["final_bytes"],
        "within_budget": load["peak_bytes"] <= base["peak_bytes"] + budget,
    }
    return {"silent": base, "printing": load, **verdict}


def memory_run(args: argparse.Namespace, env: dict[str, str], out: Path, mode: str,
               seconds: float) -> dict[str, Any]:
    import psutil  # the venv has it (forgelm-tui's own dependency)

    slot = out / "memory" / mode
    slot.mkdir(parents=True)
    target = [str(suite.RANKS / "soak_printer.py"), str(slot), str(seconds),
              str(args.print_rate if mode == "printing" else 0), str(args.seed)]
    sup = launch(supervisor_argv(args.mem_ranks, slot, [], target), slot, env)
    proc = psutil.Process(sup.pid)
    poller = select.poll()
    poller.register(sup.pidfd, select.POLLIN)
    samples: list[tuple[float, int]] = []
    hwm, t0, report = 0, time.monotonic(), max(10.0, seconds / 10)
    next_report = report
    try:
        while not poller.poll(1000):
            elapsed = time.monotonic() - t0
            if elapsed > seconds + args.timeout:
                raise suite.BenchError(f"memory {mode}: the supervisor did not end; see {slot}")
            with contextlib.suppress(psutil.Error):
                samples.append((round(elapsed, 1), proc.memory_info().rss))
                hwm = max(hwm, (suite.vm_kib(sup.pid, "VmHWM") or 0) * 1024)
            if elapsed >= next_report and samples:
                next_report += report
                print(f"  {mode}: {elapsed:5.0f} s, supervisor RSS {samples[-1][1] / MIB:.1f} MiB "
                      f"(peak {hwm / MIB:.1f})", flush=True)
        ended = sup.wait(10)
    finally:
        sup.kill()
    rss = [s[1] for s in samples] or [0]
    half = [s[1] for s in samples if s[0] >= seconds / 2] or rss
    result = {"rc": ended.rc, "seconds": seconds, "samples": len(samples),
              "peak_bytes": max(max(rss), hwm), "peak_sampled_rss_bytes": max(rss),
              "vmhwm_bytes": hwm, "final_bytes": rss[-1],
              "second_half_growth_bytes": half[-1] - half[0],
              "supervisor_stdout_bytes": (slot / "supervisor.stdout").stat().st_size,
              "stderr_tracebacks": (slot / "supervisor.stderr").read_bytes().count(b"Traceback"),
              "logs": check_printer_logs(slot, args.mem_ranks), "rss_series": samples}
    print(f"  {mode}: rc {ended.rc}; peak {result['peak_bytes'] / MIB:.1f} MiB, final "
          f"{result['final_bytes'] / MIB:.1f} MiB; logs {result['logs']}", flush=True)
    if not args.keep and result["logs"]["mismatched"] == 0:
        for log in (slot / "run").glob("rank-*.log"):
            log.unlink()
        (slot / "supervisor.stdout").unlink()
    return result


def check_printer_logs(slot: Path, ranks: int) -> dict[str, Any]:
    """Each printer wrote DIR/wrote-RANK = "BYTES CRC32" at its end: the log must match."""
    found = {"bytes": 0, "mismatched": 0, "missing_counts": 0}
    for rank in range(ranks):
        try:
            size, crc = (int(x) for x in (slot / f"wrote-{rank}").read_text().split())
        except (OSError, ValueError):
            found["missing_counts"] += 1
            continue
        log = slot / "run" / f"rank-{rank}.stdout.log"
        mine = 0
        with contextlib.suppress(OSError), open(log, "rb") as handle:
            while block := handle.read(MIB):
                mine = zlib.crc32(block, mine)
        ok = log.exists() and log.stat().st_size == size and mine == crc
        found["bytes"] += size
        found["mismatched"] += not ok
    return found


# ------------------------------------------------------------------------- report


def tables(results: dict[str, Any]) -> str:
    text = []
    if "faults" in results:
        t = results["faults"]["totals"]
        text += ["### Faults", "", "| measure | result | goal |", "|---|---|---|",
                 f"| runs (clean: every check passed) | {t['runs']} ({t['clean_runs']}) | all |",
                 f"| lines / bytes written by the ranks (counted by each rank) | "
                 f"{t['lines_written']:,} / {t['bytes_written'] / MIB:,.1f} MiB | |",
                 f"| lines lost (bytes) | {t['lost_lines']} ({t['lost_bytes']}) | 0 |",
                 f"| streams with a corrupt byte | {t['corrupt_streams']} | 0 |",
                 f"| processes of the run alive {results['meta']['settle_s']} s after the "
                 f"supervisor (daemons / ranks / other; in runs) | {t['survivors']} "
                 f"({t['surviving_daemons']} / {t['surviving_ranks']} / {t['surviving_other']}; "
                 f"{t['runs_with_survivors']}) | 0 |",
                 f"| supervisor tracebacks / runs that did not end | "
                 f"{t['supervisor_tracebacks']} / {t['supervisor_hung']} | 0 / 0 |",
                 f"| exit codes outside the contract / 0 despite a failing rank | "
                 f"{t['codes_outside_contract']} / {t['zero_despite_failure']} | 0 / 0 |",
                 f"| exit code not in SPEC 5's prediction | {t['code_not_as_predicted']} | 0 |",
                 f"| envelope problems | {t['envelope_problems']} | 0 |",
                 f"| exit codes seen | {', '.join(f'{c}: {n}' for c, n in t['codes'].items())} | |",
                 f"| supervisor wall per run, median (max) | {t['wall_s_median']} s "
                 f"({t['wall_s_max']} s) | |", ""]
        findings = [r for r in results["faults"]["runs"] if not r["clean"]]
        if findings:
            text += ["Runs with a finding:", ""]
            for r in findings:
                alive = [f"{p['kind']} {p['cmd']}" for p in r["survivors"].get("processes", [])]
                corrupt = [(c["rank"], c["stream"], c["corrupt_at"], c["lost_bytes"])
                           for c in r["streams"]["corrupt"]]
                text.append(f"- run {r['run']}: rc {r['rc']} (expected {r['expected']}, "
                            f"decided_by {r['decided_by']}); survivors {alive}; corrupt "
                            f"(rank, stream, at, lost bytes) {corrupt}; tracebacks "
                            f"{r['tracebacks']}; envelope {r['envelope_problems']}; "
                            f"plan: {r['plan'][0]} / {r['plan'][1]}")
            text.append("")
    if "memory" in results:
        m = results["memory"]

        def row(name: str, r: dict[str, Any]) -> str:
            return (f"| {name} | {r['peak_bytes'] / MIB:.1f} | {r['final_bytes'] / MIB:.1f} | "
                    f"{r['second_half_growth_bytes'] / MIB:+.1f} | "
                    f"{r['supervisor_stdout_bytes'] / MIB:.1f} | {r['logs']['bytes'] / MIB:.1f} "
                    f"({r['logs']['mismatched']} mismatched) | {r['rc']} | "
                    f"{r['stderr_tracebacks']} |")

        text += ["### Memory", "",
                 "| run | peak RSS MiB | final RSS MiB | 2nd-half growth MiB | supervisor stdout "
                 "MiB | rank logs MiB | rc | tracebacks |", "|---|---|---|---|---|---|---|---|",
                 row("silent (baseline)", m["silent"]), row("printing", m["printing"]), "",
                 f"Difference: peak {m['peak_difference_bytes'] / MIB:+.1f} MiB, final "
                 f"{m['final_difference_bytes'] / MIB:+.1f} MiB; budget "
                 f"{m['budget_bytes'] / MIB:.1f} MiB ({m['budget_formula']}): "
                 f"{'within' if m['within_budget'] else 'OVER'} (peak <= baseline peak + budget).",
                 ""]
    return "\n".join(text)


def meta(args: argparse.Namespace) -> dict[str, Any]:
    import forgelm_tui

    def git(where: Path, *args: str) -> str:
        return suite.subprocess.run(["git", "-C", str(where), *args], capture_output=True,
                                    text=True).stdout.strip()

    # The forgelm-tui that runs is the one this interpreter imports (an editable install may
    # point at another checkout than the bench's): its own commit, and whether it was modified.
    package = Path(forgelm_tui.__file__).resolve().parent
    measured = git(package, "rev-parse", "--short", "HEAD")
    if git(package, "status", "--porcelain", "."):
        measured += " (forgelm_tui modified)"
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "commit": measured,
            "bench_commit": git(suite.ROOT, "rev-parse", "--short", "HEAD"),
            "forgelm_tui": forgelm_tui.__version__, "forgelm_tui_path": str(package),
            "python": sys.version.split()[0], "nproc": os.cpu_count(),
            "kernel": os.uname().release, "load_at_start": suite.machine_load(),
            "argv": sys.argv[1:], "seed": args.seed, "runs": args.runs, "ranks": args.ranks,
            "first_run": args.first_run, "flood_mib": args.flood_mib, "grace_s": args.grace,
            "drain_s": args.drain, "settle_s": args.settle, "minutes": args.minutes,
            "mem_ranks": args.mem_ranks, "print_rate": args.print_rate, "quick": args.quick}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="3 runs x 8 ranks, memory 0.5 min x 8 ranks (unless given)")
    p.add_argument("--only", default="faults,memory", help="faults, memory, or both")
    p.add_argument("--runs", type=int, default=None, help="fault runs (100; 3 quick)")
    p.add_argument("--ranks", type=int, default=None, help="ranks per fault run (64; 8 quick)")
    p.add_argument("--first-run", type=int, default=0, help="number of the first run (replay)")
    p.add_argument("--seed", type=int, default=12, help="seed of every plan (12)")
    p.add_argument("--flood-mib", type=float, default=4.0, help="a flooding rank's most (4)")
    p.add_argument("--grace", type=float, default=3.0, help="forgelm-tui --grace (3)")
    p.add_argument("--drain", type=float, default=3.0, help="forgelm-tui --drain (3)")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds after the supervisor's end before looking for survivors (2)")
    p.add_argument("--timeout", type=float, default=180.0, help="a run that did not end (180)")
    p.add_argument("--minutes", type=float, default=None, help="memory run length (10; 0.5 quick)")
    p.add_argument("--mem-ranks", type=int, default=None, help="memory run ranks (64; 8 quick)")
    p.add_argument("--print-rate", type=float, default=10.0,
                   help="records per second per printing rank (10, about 11 KB/s)")
    p.add_argument("--keep", action="store_true", help="keep every slot (logs are MiBs)")
    p.add_argument("--out", type=Path, default=None, help="default bench/out/soak-TIME")
    p.add_argument("--json", type=Path, default=None,
                   help="raw results (bench/soak.json; the out dir with --quick)")
    args = p.parse_args(argv)
    args.runs = args.runs or (3 if args.quick else 100)
    args.ranks = args.ranks or (8 if args.quick else 64)
    args.minutes = args.minutes or (0.5 if args.quick else 10.0)
    args.mem_ranks = args.mem_ranks or (8 if args.quick else 64)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    only = set(args.only.split(","))
    out = (args.out or BENCH / "out" / time.strftime("soak-%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or (out / "soak.json" if args.quick else BENCH / "soak.json")
    env = suite.bench_env()

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    results: dict[str, Any] = {"meta": meta(args)}
    print(f"soak: out {out}; forgelm-tui {results['meta']['commit']} from "
          f"{results['meta']['forgelm_tui_path']}; load "
          f"{results['meta']['load_at_start']['busy_cpus']} of {os.cpu_count()} CPUs busy",
          flush=True)
    started = time.monotonic()
    try:
        if "faults" in only:
            results["faults"] = faults(args, env, out)
        if "memory" in only:
            results["memory"] = memory(args, env, out)
    finally:
        killed = suite.kill_leftovers()
        if killed:
            print(f"soak: killed {killed} leftover process(es)", file=sys.stderr)
    results["meta"]["bench_seconds"] = round(time.monotonic() - started, 1)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    text = tables(results)
    (out / "tables.md").write_text(text + "\n")
    print("\n" + text)
    print(f"soak: {results['meta']['bench_seconds']} s; raw numbers in {json_path}; tables in "
          f"{out / 'tables.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
