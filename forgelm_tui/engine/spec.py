"""What to launch and how: the launch spec and the torchrun-compatible rank environment."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from forgelm_tui.rank.collectives import COLLECTIVES_ENV
from forgelm_tui.redact import shown_argv

# NCCL's flight-recorder pipe and dump (engine/nccl_dump.py): torch's variables, each + rank
PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # torch reads both
PIPE_STEM = "nccl-pipe-rank-"
DUMP_STEM = "nccl-trace-rank-"

# torchrun sets these per worker (torch/distributed/run.py and the local elastic agent).
_TORCHRUN_CLEARED = ("TORCHELASTIC_USE_AGENT_STORE",)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything the engine needs to run one node's ranks. Built by the CLI, never mutated."""

    argv: tuple[str, ...]  # what every rank executes, argv[0] resolved
    run_id: str
    run_dir: Path
    nproc_per_node: int
    master_addr: str
    master_port: int
    nnodes: int = 1
    node_rank: int = 0
    grace: float = 30.0  # SIGTERM -> SIGKILL, one shared deadline
    drain: float = 60.0  # after rank 0 ends with an outcome, how long the others may finish
    stall_timeout: float | None = None  # no progress from any rank this long -> stop
    quiet_after: float = 10.0  # a rank with no progress this long is marked quiet
    stacks_deadline: float = 2.0  # a stall stop waits at most this long for the ranks' stacks
    sample_interval: float = 1.0
    forward_signals: tuple[int, ...] = (signal.SIGUSR1, signal.SIGUSR2)
    # The scheduler's own signals reach every rank too (SLURM with proctrack/linuxproc): one
    # it sent to forgelm-tui is recorded, not forwarded again (engine/signal_inbox.py).
    scheduler_reaches_ranks: bool = False
    extra_env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    unbuffered: bool = True  # PYTHONUNBUFFERED=1 unless the caller set it
    restart_count: int = 0  # which attempt this is (0: the first launch)
    max_restarts: int = 0  # --max-restarts: how many restarts the run may make
    uncounted: int = 0  # attempts before this one that an elastic run's new node began
    # Whose environment the ranks get (docs/launchers.md): torchrun's, deepspeed's launcher's
    # (CROSS_RANK/CROSS_SIZE/LOCAL_SIZE, no LOCAL_WORLD_SIZE, GROUP_* nor TORCHELASTIC_*), or
    # accelerate's one-process launcher's ("single": no rank variables at all).
    env_style: str = "torchrun"
    local_rank_at: int | None = None  # deepspeed: ``--local_rank=N`` goes in at this index
    role: str = "default"  # torchrun's --role: ROLE_NAME

    def for_attempt(self, attempt: int, uncounted: int = 0) -> LaunchSpec:
        """The spec of restart ``attempt`` (1, 2...): the same ranks, their files in
        ``<run dir>/attempt-<attempt>/`` (the first attempt's stay where they always were)."""
        return replace(self, run_dir=self.run_dir / f"attempt-{attempt}",
                       restart_count=attempt, uncounted=uncounted)

    @property
    def restarts_used(self) -> int:
        """Restarts counted against --max-restarts so far (TORCHELASTIC_RESTART_COUNT)."""
        return self.restart_count - self.uncounted

    @property
    def shown_argv(self) -> tuple[str, ...]:
        """``argv`` as views, viewers and other nodes see it: secret values redacted."""
        return shown_argv(self.argv)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank

    def error_file(self, rank: int) -> Path:
        return self.run_dir / f"rank-{rank}.error.json"

    def log_file(self, rank: int, stream: str) -> Path:
        return self.run_dir / f"rank-{rank}.{stream}.log"


def rank_argv(spec: LaunchSpec, local_rank: int) -> tuple[str, ...]:
    """What this rank executes: ``argv``, with deepspeed's ``--local_rank=N`` after the
    script where its launcher puts it."""
    at = spec.local_rank_at
    if at is None:
        return spec.argv
    return (*spec.argv[:at], f"--local_rank={local_rank}", *spec.argv[at:])


def rank_env(spec: LaunchSpec, local_rank: int, base: Mapping[str, str]) -> dict[str, str]:
    """The environment the launcher forgelm-tui stands in for would give this rank, on top
    of ``base``: torchrun's unless ``env_style`` says otherwise."""
    if spec.env_style == "deepspeed":
        return {**_deepspeed_env(spec, local_rank, base), **_nccl_dumps(spec, base)}
    if spec.env_style == "single":
        return {**base, **spec.extra_env, "FORGELM_TUI_RUN_DIR": str(spec.run_dir)}
    rank = spec.global_rank(local_rank)
    env = {k: v for k, v in base.items() if k not in _TORCHRUN_CLEARED}
    env.update(spec.extra_env)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(spec.world_size),
            "LOCAL_WORLD_SIZE": str(spec.nproc_per_node),
            "GROUP_RANK": str(spec.node_rank),
            "GROUP_WORLD_SIZE": str(spec.nnodes),
            "ROLE_RANK": str(rank),
            "ROLE_NAME": spec.role,
            "ROLE_WORLD_SIZE": str(spec.world_size),
            "MASTER_ADDR": spec.master_addr,
            "MASTER_PORT": str(spec.master_port),
            "TORCHELASTIC_RUN_ID": spec.run_id,
            "TORCHELASTIC_RESTART_COUNT": str(spec.restarts_used),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
            # torchrun's --signals-to-handle, which it exports: forgelm-tui handles the same
            "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
            "TORCHELASTIC_ERROR_FILE": str(spec.error_file(rank)),
            "FORGELM_TUI_RUN_DIR": str(spec.run_dir),
        }
    )
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.update(_nccl_dumps(spec, base))
    if spec.world_size > 1 or spec.nproc_per_node > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    if spec.unbuffered:
        env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def dump_env(run_dir: Path, base: Mapping[str, str]) -> dict[str, str]:
    """NCCL's dump pipe and dump file under the run dir, each unless the user set it; the pipe
    only where a FIFO can be made there: torch makes it with a check that, failing in its
    monitor thread, would abort the rank (a FUSE mount of an object store has no FIFOs)."""
    env = {}
    if PIPE_VAR not in base and fifos_work(run_dir):
        env[PIPE_VAR] = str(run_dir / PIPE_STEM)
    if not any(var in base for var in DUMP_VARS):
        env[DUMP_VARS[1]] = str(run_dir / DUMP_STEM)
    return env


@functools.lru_cache(maxsize=16)
def fifos_work(directory: Path) -> bool:
    """A named pipe can be made in ``directory`` (tried once a directory, then removed)."""
    probe = directory / f".fifo-probe-{os.getpid()}"
    try:
        os.mkfifo(probe, 0o600)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


def _nccl_dumps(spec: LaunchSpec, base: Mapping[str, str]) -> dict[str, str]:
    """With the collective trace on, NCCL's flight-recorder dumps go to the run dir
    (engine/nccl_dump.py)."""
    return dump_env(spec.run_dir, base) if spec.extra_env.get(COLLECTIVES_ENV) == "1" else {}


def _deepspeed_env(spec: LaunchSpec, local_rank: int, base: Mapping[str, str]) -> dict[str, str]:
    """deepspeed.launcher.launch's: the rank variables, the node's place among the nodes
    (CROSS_*) and how many ranks it has (LOCAL_SIZE); the visible devices come in
    ``extra_env`` (its accelerator's variable); Python runs with ``-u``, no variable."""
    return {**base, **spec.extra_env,
            "MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port),
            "WORLD_SIZE": str(spec.world_size), "CROSS_RANK": str(spec.node_rank),
            "CROSS_SIZE": str(spec.nnodes), "LOCAL_SIZE": str(spec.nproc_per_node),
            "RANK": str(spec.global_rank(local_rank)), "LOCAL_RANK": str(local_rank),
            "FORGELM_TUI_RUN_DIR": str(spec.run_dir)}
