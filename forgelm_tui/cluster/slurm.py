"""Configuration from inside an srun step: node count, node rank, master address, run id.

The job's node list is expanded by ``scontrol show hostnames`` (SLURM's own parser), never by
hand. One forgelm-tui per node: more than one task per node is refused.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass


class SlurmError(Exception):
    """The SLURM environment cannot describe a run (one line for the operator)."""


@dataclass(frozen=True)
class SlurmStep:
    nnodes: int
    node_rank: int
    master_addr: str
    run_id: str
    job_id: str
    step_id: str = "0"


def in_srun_step(env: Mapping[str, str]) -> bool:
    return "SLURM_STEP_ID" in env and "SLURM_PROCID" in env


def read_step(env: Mapping[str, str]) -> SlurmStep:
    nnodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    tasks = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    counts = [int(c) for c in re.findall(r"(\d+)(?:\(x\d+\))?", per_node)]
    if tasks > nnodes or any(c > 1 for c in counts):
        raise SlurmError(f"SLURM step has {tasks} tasks on {nnodes} nodes: run one forgelm-tui "
                         "per node (srun --ntasks-per-node=1); it starts the ranks itself")
    node_rank = _int(env, "SLURM_NODEID", "SLURM_PROCID")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") \
        or env.get("SLURM_NODELIST")
    if not nodelist:
        raise SlurmError("SLURM step without a node list (SLURM_STEP_NODELIST / "
                         "SLURM_JOB_NODELIST)")
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "0"
    master = "127.0.0.1" if nnodes == 1 else first_host(nodelist)  # one node: nothing to find
    return SlurmStep(nnodes, node_rank, master, f"slurm-{job}.{env['SLURM_STEP_ID']}", job,
                     env["SLURM_STEP_ID"])


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``gpu[01-04,07]`` -> ``gpu01``), by scontrol."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise SlurmError(f"cannot expand the SLURM node list {nodelist!r}: scontrol is not on "
                         "PATH (give --master-addr)")
    try:
        done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"scontrol show hostnames {nodelist}: {exc}") from None
    hosts = done.stdout.split()
    if done.returncode != 0 or not hosts:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no hosts"
        raise SlurmError(f"scontrol show hostnames {nodelist}: {why}")
    return hosts[0]


def default_port(job_id: str, step_id: str = "0") -> int:
    """A master port every node of the step derives alike (no flag needed), even, in
    20000-39998; the control store takes the odd port above it. Jobs (and steps) that share a
    node never take each other's pair: consecutive job ids used to (job N's store port was job
    N+1's master port), and a scheduler puts consecutive jobs on one node all the time."""
    step = int(step_id) if step_id.isdigit() else 0
    try:
        slot = (int(job_id) * 4 + step) % 10000
    except ValueError:
        return 29500
    return 20000 + 2 * slot


def _int(env: Mapping[str, str], *names: str) -> int:
    for name in names:
        value = env.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise SlurmError(f"{name}={value!r} is not a number") from None
    raise SlurmError(f"SLURM step without {names[0]}")
