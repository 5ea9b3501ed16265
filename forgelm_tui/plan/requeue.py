"""A requeued SLURM job (``sbatch --requeue``, ``PreemptMode=REQUEUE``, ``scontrol requeue``):
the same job id, its step ids from 0 again, so the same run id and run dir as the run before.
Each requeue's files go in ``<run dir>/requeue-<SLURM_RESTART_COUNT>/`` instead, never over
the earlier runs' (the first run's stay where they always were), and its envelope lists the
earlier runs' envelopes in ``requeues`` (docs/schedulers.md, docs/envelope.md).

``requeue-N``, not ``attempt-N``: a requeued run may restart too (``--max-restarts``), and its
restarts' ``attempt-K/`` live inside its own run dir.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def requeue_count(env: Mapping[str, str]) -> int:
    """How many times SLURM requeued this job (0 outside a SLURM job, or never requeued)."""
    if "SLURM_JOB_ID" not in env:
        return 0
    try:
        return max(0, int(env.get("SLURM_RESTART_COUNT", "0")))
    except ValueError:
        return 0


def requeue_dir(run_dir: Path, count: int) -> Path:
    return run_dir / f"requeue-{count}" if count else run_dir


def requeues_entry(base: Path, count: int) -> dict[str, Any] | None:
    """``requeues``: how many times the job was requeued, and each earlier run's envelope
    (its path and exit code; null where that run left none: a node lost with its files)."""
    if not count:
        return None
    earlier = []
    for number in range(count):
        path = requeue_dir(base, number) / "envelope.json"
        try:
            code = json.loads(path.read_text()).get("exit_code")
            found: str | None = str(path)
        except (OSError, ValueError, AttributeError):
            code, found = None, None
        earlier.append({"requeue": number, "envelope": found, "exit_code": code})
    return {"count": count, "earlier": earlier}
