"""A scheduler's signals, with real processes: what slurmstepd does at a time limit (SIGTERM,
SIGCONT, SIGTERM within milliseconds, to every process of the step, ranks included), played by
the test process, which is the supervisor's parent as slurmstepd is under srun (SLURM_JOB_ID set).
The rules are tested on an injected clock in test_outside_signals.py; the real SLURM cluster in
test_slurm_cluster.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import rank_script, start, wait_for

pytestmark = pytest.mark.timeout(60)

SCHEDULER_ENV = {"SLURM_JOB_ID": "4242", "FORGELM_TUI_KILL_WAIT": "60"}


def got_usr1(marks: Path, ranks: int) -> bool:
    """Every rank has handled its SIGUSR1: a whole line in its mark (the file exists from the
    handler's open, a moment before its write: a SIGTERM then would cut it)."""
    paths = [marks / f"usr1-{r}" for r in range(ranks)]
    return all(p.exists() and p.read_text().endswith("\n") for p in paths)


def scheduler_env(tmp_path: Path, proctrack: str = "linuxproc") -> dict[str, str]:
    """Inside a SLURM job: a stand-in ``scontrol show config`` says how slurmstepd tracks the
    step's processes (linuxproc: its signals reach every rank too; cgroup: only the task)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho 'ProctrackType           = proctrack/{proctrack}'\n")
    scontrol.chmod(0o755)
    return {**SCHEDULER_ENV, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def ready(marks: Path, ranks: int) -> dict[int, tuple[int, int]]:
    """Each rank's pid and blocked-signal mask, once every rank is set up."""

    def read() -> dict[int, tuple[int, int]] | None:
        files = [marks / f"ready-{r}" for r in range(ranks)]
        if not all(f.exists() for f in files):
            return None
        found = {}
        for rank, file in enumerate(files):
            pid, mask = file.read_text().split()
            found[rank] = (int(pid), int(mask, 16))
        return found

    return dict(wait_for(read, 30, f"{ranks} ranks to be ready"))


def burst(pids: list[int]) -> None:
    """slurmstepd at a time limit: SIGTERM, SIGCONT, SIGTERM to every process of the step."""
    for sig in (signal.SIGTERM, signal.SIGCONT, signal.SIGTERM):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


@pytest.mark.fault("F42")
@pytest.mark.parametrize("runner", [False, True], ids=["own-handler", "graceful-runner"])
def test_a_time_limit_burst_is_one_graceful_stop_and_every_cleanup_finishes(
        tmp_path: Path, marks: Path, runner: bool) -> None:
    """Rank 2 has no handler (own-handler case): it dies of the scheduler's SIGTERM at once, and
    that is part of the outside stop, not a failure on its own."""
    no_handler = "-" if runner else "2"
    args = ["--nproc-per-node", "3", "--grace", "20", *(["--graceful"] if runner else []),
            rank_script("term_burst.py"), str(marks), "1.5", no_handler]
    if runner:
        args.append("--runner")
    run = start(args, tmp_path, env=scheduler_env(tmp_path))
    ranks = ready(marks, 3)
    assert all(mask == 0 for _, mask in ranks.values()), f"ranks start unblocked: {ranks}"
    burst([run.proc.pid, *(pid for pid, _ in ranks.values())])
    assert run.wait(40) == 2
    envelope = run.envelope()
    requests = envelope["cancel_requests"]
    assert [r["effect"] for r in requests][:1] == ["stop"], requests
    assert all(r["effect"] == "merged" for r in requests[1:]), requests  # SIGCONT is none
    assert {r["sender"]["pid"] for r in requests} == {os.getpid()}
    assert {r["sender"]["kind"] for r in requests} == {"scheduler"}
    with_cleanup = [0, 1, 2] if runner else [0, 1]
    for rank in with_cleanup:
        assert (marks / f"cleanup-{rank}").read_text() == "done", f"rank {rank}'s cleanup"
    for rank in envelope["ranks"]:
        assert "SIGKILL" not in [s["signal"] for s in rank["signals_sent"]], rank
    assert envelope["decided_by"]["rule"] == 4 and envelope["root_cause_rank"] is None
    if not runner:
        rank2 = envelope["ranks"][2]
        assert rank2["signal"] == "SIGTERM" and rank2["state"] == "killed"
        # whichever the supervisor saw first: its death, or its own copy of the SIGTERM (the
        # order is the policy's to judge: test_outside_signals.py, on an injected clock)
        assert rank2["killed_from_outside"] or rank2["signalled_by_supervisor"], rank2


def test_a_rank_killed_by_sigterm_alone_is_still_a_failure(tmp_path: Path,
                                                             marks: Path) -> None:
    """Only rank 1 gets SIGTERM (someone killed that process): no outside stop explains it."""
    run = start(["--nproc-per-node", "2", "--grace", "5",
                 rank_script("term_burst.py"), str(marks), "0.1", "1"], tmp_path,
                env=scheduler_env(tmp_path))
    ranks = ready(marks, 2)
    os.kill(ranks[1][0], signal.SIGTERM)
    assert run.wait(30) == 2
    envelope = run.envelope()
    assert envelope["stop"]["kind"] == "failure"
    assert envelope["root_cause_rank"] == 1
    assert envelope["ranks"][1]["killed_from_outside"] is False
    assert envelope["cancel_requests"] == []


@pytest.mark.parametrize("proctrack", ["linuxproc", "cgroup"])
def test_the_schedulers_sigusr1_reaches_each_rank_once(tmp_path: Path, marks: Path,
                                                       proctrack: str) -> None:
    """``--signal=USR1@N`` under srun: with proctrack/linuxproc slurmstepd signals every process
    of the step, so the supervisor records it and sends it to no rank again; with cgroup only
    the task (the supervisor) gets it, so it is forwarded as any other."""
    run = start(["--nproc-per-node", "2", rank_script("term_burst.py"), str(marks), "0.1", "-"],
                tmp_path, env=scheduler_env(tmp_path, proctrack))
    ranks = ready(marks, 2)
    direct = proctrack == "linuxproc"
    for pid in [run.proc.pid, *(pid for pid, _ in ranks.values() if direct)]:
        os.kill(pid, signal.SIGUSR1)
    wait_for(lambda: got_usr1(marks, 2), 10, "SIGUSR1")
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    envelope = run.envelope()
    forwarded = envelope["forwarded_signals"]
    assert len(forwarded) == 1 and forwarded[0]["sent_by_scheduler"] is direct, forwarded
    assert forwarded[0]["sender"]["kind"] == "scheduler" and forwarded[0]["ranks"] == [0, 1]
    for rank in range(2):
        assert len((marks / f"usr1-{rank}").read_text().splitlines()) == 1
    resent = [s for r in envelope["ranks"] for s in r["signals_sent"] if s["purpose"] == "forward"]
    assert len(resent) == (0 if direct else 2), resent


def test_a_second_sigint_from_another_process_still_kills_at_once(tmp_path: Path,
                                                                   marks: Path) -> None:
    """A person asking again (another process) escalates even under a scheduler."""
    run = start(["--nproc-per-node", "2", "--grace", "30", "--exit-contract", "raw",
                 rank_script("sleeper.py"), str(marks), "--ignore-term", "0"], tmp_path,
                env=scheduler_env(tmp_path))
    wait_for(lambda: all((marks / f"ready-{r}").exists() for r in range(2)), 30, "ready")
    run.signal(signal.SIGINT)
    wait_for(lambda: (marks / "got-SIGTERM-0").exists(), 10, "rank 0 to get SIGTERM")
    subprocess.run([sys.executable, "-c", f"import os; os.kill({run.proc.pid}, 2)"], check=True)
    assert run.wait(30) == 130
    requests = run.envelope()["cancel_requests"]
    assert [r["effect"] for r in requests] == ["stop", "kill"]
    assert requests[0]["sender"]["kind"] == "scheduler"
    assert requests[1]["sender"]["kind"] == "process"


def test_the_schedulers_early_sigusr1_waits_for_each_ranks_handler(tmp_path: Path,
                                                                   marks: Path) -> None:
    """``--signal=USR1@N`` may come up to 60 s early, while the ranks start: a rank that installs
    its handler late (Lightning at ``fit``) gets it once it has one, instead of dying of it."""
    run = start(["--nproc-per-node", "2", rank_script("term_burst.py"), str(marks), "0.1", "-",
                 "--usr1-late", "1.5"], tmp_path, env=scheduler_env(tmp_path, "cgroup"))
    ready(marks, 2)
    os.kill(run.proc.pid, signal.SIGUSR1)
    wait_for(lambda: got_usr1(marks, 2), 20,
             "each rank to get SIGUSR1 once it handles it")
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    envelope = run.envelope()
    assert all(r["signal"] is None and r["exit_code"] == 2 for r in envelope["ranks"])
    (forwarded,) = envelope["forwarded_signals"]
    assert forwarded["ranks"] == [0, 1] and forwarded["held_since"] is not None, forwarded


def test_a_signal_while_the_run_is_planned_waits_for_its_handler(tmp_path: Path,
                                                                 marks: Path) -> None:
    """``sbatch --signal=USR1@N`` may fire as the job starts: a SIGUSR1 while forgelm-tui still
    plans the run (here: inside its `scontrol show config`) used to end the supervisor (the
    default action). It waits for the run's handlers, then for the ranks'."""
    env = scheduler_env(tmp_path, "cgroup")
    planning = tmp_path / "planning"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ntouch {planning}\nsleep 1\n"
                        "echo 'ProctrackType           = proctrack/cgroup'\n")
    run = start(["--nproc-per-node", "2", rank_script("term_burst.py"), str(marks), "0.1", "-"],
                tmp_path, env=env)
    wait_for(planning.exists, 30, "forgelm-tui to be planning the run")
    os.kill(run.proc.pid, signal.SIGUSR1)
    ready(marks, 2)
    wait_for(lambda: got_usr1(marks, 2), 20,
             "each rank to get the early SIGUSR1")
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    (forwarded,) = run.envelope()["forwarded_signals"]
    assert forwarded["ranks"] == [0, 1] and forwarded["held_since"] is not None, forwarded


def test_the_usual_signals_are_blocked_before_the_cli_is_imported(tmp_path: Path) -> None:
    """The console script and ``python -m forgelm_tui`` block them on their first line: a
    SIGUSR1 during the CLI's imports (~150 ms, seconds on a loaded node; the real cluster's
    early ``--signal`` once came there) waits for its handler too. Read from inside the run, at
    the moment ``forgelm_tui.cli`` starts to load; views keep them unblocked."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib.abc, runpy, sys\n"
        "class Probe(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'forgelm_tui.cli':\n"
        "            with open('/proc/self/status') as status:\n"
        "                mask = int(status.read().split('SigBlk:')[1].split()[0], 16)\n"
        "            print(mask, flush=True)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Probe())\n"
        "sys.argv = ['forgelm-tui', *sys.argv[1:]]\n"
        "runpy.run_module('forgelm_tui', run_name='__main__')\n")
    for args, held in ((["--version"], True), (["ls", str(tmp_path / "none")], False)):
        done = subprocess.run([sys.executable, str(probe), *args], capture_output=True,
                              text=True, timeout=30, cwd=tmp_path)
        mask = int(done.stdout.split()[0])
        blocked = {s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGQUIT)
                   if mask & (1 << (s - 1))}
        assert blocked == ({signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGQUIT}
                           if held else set()), (args, hex(mask), done.stderr)
