"""Jobs on the real SLURM test cluster (tests/slurm/cluster.sh): submit, wait, read.

Every job of tests/test_slurm_cluster.py is submitted at once, by whichever xdist worker asks
first (a file lock in the directory every worker shares): the cluster runs them side by side
(each takes one CPU on each of the two nodes), so the slowest, a time limit that slurmctld
enforces 60-90 s late, sets the wall time of all of them. Each test then waits for its own job,
acts on it (scancel, a SIGKILL, a network cut) and reads what every node wrote.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_env, rank_script

CLUSTER = Path(__file__).parent / "slurm" / "cluster.sh"
REQUIRE = "FORGELM_TUI_REQUIRE_SLURM"
# The jobs start together: ~60 Python processes importing torch at once on this machine's 2
# cores (both test nodes live on them). A supervisor's heartbeat went unanswered for 5 s in
# that storm (a healthy node 0 declared lost, 2 runs in 3 one slow hour) and a node 0 took over
# 60 s to host its store: the node timeout and the join timeout allow for it.
NODE_TIMEOUT = 15
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@dataclass(frozen=True)
class Scenario:
    name: str
    target: list[str]  # forgelm-tui's own options and the rank command (or `demo ...`)
    sbatch: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # on top of the client's (sbatch exports)
    # The batch script requeues its own job once rank 3 trains (scontrol requeue, as a
    # preemption with PreemptMode=REQUEUE would); the requeued run trains 5 steps and ends.
    requeue_self: bool = False
    script: str | None = None  # the whole batch script instead (its own srun lines)


def forgelm_job(root: Path) -> tuple[Path, dict[str, str]]:
    """A real ForgeLM job (tests/forgelm_job.py) whose training outlasts a time limit, and the
    environment its ranks need: each step waits 0.5 s (tests/slow_steps), as on a GPU, so the
    two minutes before the limit cost the suite a few seconds of CPU, not four ranks' worth."""
    from forgelm_job import build_tiny_model, job_env, make_job

    job = make_job(root / "job", max_steps=5000, model_dir=build_tiny_model(root / "model"))
    env = job_env(job.dir, base={})
    env.update({"FORGELM_TEST_STEP_SECONDS": "0.5",
                "PYTHONPATH": str(Path(__file__).parent / "slow_steps")})
    return job.config, env


def scenarios(marks: Callable[[str], Path], root: Path, qos: bool = False) -> list[Scenario]:
    """The jobs, each 2 nodes x 2 gloo ranks (one forgelm-tui per node, as srun runs it);
    ``qos``: the cluster preempts by QOS (the preemptible job asks for QOS ``low``)."""
    demo = ["demo", "--step-time", "0.2"]
    config, forgelm_env = forgelm_job(root / "time_limit_forgelm")
    loop = [rank_script("gloo_loop.py")]
    return [
        Scenario("approval", [*demo, "--steps", "3", "--exit-code", "4"]),
        Scenario("failure", [*demo, "--steps", "400", "--fail-rank", "3", "--fail-step", "3"]),
        Scenario("scancel", [*demo, "--steps", "100000", "--cleanup-seconds", "3"]),
        # --time=3: slurmctld ends them 180-210 s in, the ranks long past their start (a rank
        # that has not installed its handler yet dies of SIGTERM, cleanup or not). --time=2
        # was too short in a slow hour: with the whole suite beside them, the demo's ranks
        # were still in their first step and ForgeLM's still importing transformers at 120 s.
        Scenario("time_limit_demo", [*demo, "--steps", "100000", "--cleanup-seconds", "2"],
                 ["--time=3"]),
        Scenario("time_limit_runner",
                 ["--graceful", rank_script("term_burst.py"), str(marks("time_limit_runner")),
                  "2", "-", "--runner", "--gloo"], ["--time=3", "--signal=USR1@40"]),
        # ForgeLM mode: the real ForgeLM, training when the limit comes
        Scenario("time_limit_forgelm", ["--config", str(config)], ["--time=3"], forgelm_env),
        Scenario("sigkill_node", ["--node-timeout", str(NODE_TIMEOUT), *loop,
                                  str(marks("sigkill_node"))]),
        # the only job of the preemptible partition, holding 14 of each node's 28 CPUs: the
        # one-CPU jobs (10, up to 14 fit beside it) all start at once, and the urgent job,
        # needing 15, can only start by preempting it, whatever else runs (the one-CPU jobs
        # are of `debug`, a tier no higher than `low`'s: they never preempt it)
        Scenario("preempted", [*demo, "--steps", "100000", "--cleanup-seconds", "2"],
                 ["--partition=low", "--cpus-per-task=14",
                  *(["--qos=low"] if qos else [])]),
        Scenario("network_cut", ["--node-timeout", str(NODE_TIMEOUT), "--grace", "3", *loop,
                                 str(marks("network_cut"))]),
        Scenario("requeue", demo, ["--requeue"], requeue_self=True),
        # the launchers' own multi-node forms under srun (docs/launchers.md)
        Scenario("launchers", [], env={"DUMP_EXIT": "0=4", "ACCELERATE_USE_CPU": "true",
                                        "HF_HOME": str(root / "launchers" / "hf")},
                 script=launchers_script(root / "launchers")),
    ]


def launchers_script(job_dir: Path) -> str:
    """Two steps, one forgelm-tui per node each: ``deepspeed --hostfile H --no_ssh --node_rank
    $SLURM_NODEID --master_addr NODE0`` and ``accelerate launch --num_machines 2 --machine_rank
    $SLURM_NODEID --main_process_ip NODE0``; rank 0 exits 4 (tests/ranks/dump_env.py)."""
    head = [sys.executable, "-m", "forgelm_tui", "--no-tui", "--join-timeout", "180"]
    steps = {
        "deepspeed": ["deepspeed", "--hostfile", "hosts", "--no_ssh", "--node_rank",
                      "$SLURM_NODEID", "--master_addr", "$M", "--master_port", "29611"],
        "accelerate": ["accelerate", "launch", "--multi_gpu", "--num_processes", "4",
                       "--num_machines", "2", "--machine_rank", "$SLURM_NODEID",
                       "--main_process_ip", "$M", "--main_process_port", "29621"]}
    lines = ["trap '' TERM", 'M=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)',
             'for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do echo "$n slots=2"; '
             "done > hosts"]
    for name, words in steps.items():
        dump = job_dir / f"dump-{name}"
        command = " ".join([*map(shlex.quote, head), "--run-dir",
                            shlex.quote(str(job_dir / f"run-{name}")), *words,
                            shlex.quote(rank_script("dump_env.py"))])
        lines.append(f"mkdir -p {shlex.quote(str(dump))}; export M; srun --ntasks-per-node=1 "
                     f"bash -c {shlex.quote(f'DUMP_DIR={dump} exec {command}')}")
    return "\n".join(lines)


def cluster_env() -> dict[str, str]:
    """The exports a SLURM client needs (``cluster.sh env``), on top of the CLI's env."""
    done = subprocess.run(["bash", str(CLUSTER), "env"], capture_output=True, text=True,
                          timeout=30, check=True)
    env = cli_env()
    for line in done.stdout.splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            for word in words[1:]:
                key, _, value = word.partition("=")
                env[key] = value
    return env


def qos_preemption(env: dict[str, str]) -> bool:
    """The cluster preempts by QOS (``FSLURM_PREEMPT=qos``), not by partition tier."""
    done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                          env=env, timeout=30, check=True)
    return any(line.split("=", 1)[0].strip() == "PreemptType"
               and line.split("=", 1)[1].strip() == "preempt/qos"
               for line in done.stdout.splitlines() if "=" in line)


def unavailable() -> str | None:
    """Why the real-SLURM tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: the SLURM test cluster runs daemons in network namespaces"
    if subprocess.run(["bash", str(CLUSTER), "healthy"], capture_output=True,
                      timeout=60).returncode != 0:
        return ("the SLURM test cluster is not up (as root: bash tests/slurm/cluster.sh up; "
                ".ci/run does it)")
    return None


def skip_or_fail() -> None:
    why = unavailable()
    if why is None:
        return
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 but the SLURM tests cannot run: {why}", pytrace=False)
    pytest.skip(why)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class Job:
    name: str
    job_id: str
    root: Path  # the job's own directory: run/ (node-N/), marks/, slurm.out
    env: dict[str, str]

    @property
    def marks(self) -> Path:
        return self.root / "marks"

    def node_dir(self, node: int) -> Path:
        return self.root / "run" / f"node-{node}"

    def envelope(self, node: int) -> dict[str, Any]:
        return json.loads((self.node_dir(node) / "envelope.json").read_text())

    def log(self, node: int, rank: int) -> str:
        path = self.node_dir(node) / f"rank-{rank}.stdout.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def slurm_out(self) -> str:
        path = self.root / "slurm.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def sacct(self) -> dict[str, tuple[str, str]]:
        """JobID -> (State, ExitCode) for the job and its steps, as accounting has them."""
        done = subprocess.run(["sacct", "-j", self.job_id, "-n", "-P", "-o",
                               "JobID,State,ExitCode"], capture_output=True, text=True,
                              env=self.env, timeout=30, check=False)
        rows = {}
        for line in done.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 3:
                rows[parts[0]] = (parts[1].split()[0], parts[2])
        return rows

    def queued(self) -> bool:
        """Still in slurmctld's queue (running or completing)."""
        done = subprocess.run(["squeue", "-h", "-j", self.job_id, "-o", "%T"],
                              capture_output=True, text=True, env=self.env, timeout=30,
                              check=False)
        return done.returncode == 0 and bool(done.stdout.strip())

    def wait_end(self, timeout: float) -> tuple[str, str]:
        """The job's final (State, ExitCode) in accounting; fails past ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # out of the queue first: accounting names a cancelled job's state at the scancel,
            # while its steps (forgelm-tui in its grace) still run
            if not self.queued():
                rows = self.sacct()
                if self.job_id in rows and all(s in TERMINAL for s, _ in rows.values()):
                    return rows[self.job_id]
            time.sleep(0.5)
        pytest.fail(f"job {self.name} ({self.job_id}) did not end in {timeout:g} s: "
                    f"{self.sacct()}\n{self.slurm_out()[-3000:]}", pytrace=False)

    def scancel(self, *args: str) -> None:
        subprocess.run(["scancel", *args, self.job_id], env=self.env, timeout=30, check=True)


def submit(scenario: Scenario, root: Path, env: dict[str, str]) -> Job:
    job_dir = root / scenario.name
    env = {**env, **scenario.env}
    (job_dir / "marks").mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir",
               str(job_dir / "run"), "--nproc-per-node", "2", "--join-timeout", "180",
               *scenario.target]
    # The batch shell ignores SLURM's SIGTERM: dying of it, it would take srun with it, and the
    # step would be SIGKILLed a few seconds later instead of KillWait (docs/schedulers.md).
    wrap = "trap '' TERM; srun --ntasks-per-node=1 " + shlex.join(command)
    if scenario.script is not None:
        wrap = scenario.script
    if scenario.requeue_self:
        log = shlex.quote(str(job_dir / "run" / "node-1" / "rank-3.stdout.log"))
        wrap = (f"trap '' TERM; if [ \"${{SLURM_RESTART_COUNT:-0}}\" = 0 ]; then srun "
                f"--ntasks-per-node=1 {shlex.join([*command, '--steps', '100000'])} & "
                f"until grep -q 'step 3/' {log} 2>/dev/null; do sleep 1; done; "
                f"scontrol requeue \"$SLURM_JOB_ID\"; wait; else srun --ntasks-per-node=1 "
                f"{shlex.join([*command, '--steps', '5'])}; fi")
    done = subprocess.run(
        ["sbatch", "--parsable", "-N2", "--ntasks-per-node=1",
         *([] if any(o.startswith("--cpus") for o in scenario.sbatch) else ["--cpus-per-task=1"]),
         f"--job-name=ftui-{scenario.name}", f"--output={job_dir / 'slurm.out'}",
         f"--chdir={job_dir}", *scenario.sbatch, f"--wrap={wrap}"],
        capture_output=True, text=True, env=env, timeout=60, check=False)
    if done.returncode != 0:
        pytest.fail(f"sbatch {scenario.name}: {done.stderr.strip()}", pytrace=False)
    return Job(scenario.name, done.stdout.strip().split(";")[0], job_dir, env)


def submit_all(root: Path) -> dict[str, Job]:
    """Every scenario's job, submitted once per test session (the first worker to ask)."""
    record = root / "jobs.json"
    with locked(root / "jobs.lock"):
        env = cluster_env()
        if record.exists():
            known = json.loads(record.read_text())
            return {name: Job(name, job_id, root / name, env) for name, job_id in known.items()}
        jobs = {s.name: submit(s, root, env)
                for s in scenarios(lambda n: root / n / "marks", root, qos_preemption(env))}
        record.write_text(json.dumps({name: job.job_id for name, job in jobs.items()}))
        return jobs
