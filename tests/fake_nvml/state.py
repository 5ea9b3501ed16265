"""Writing the fake NVML's state (tests/fake_nvml/pynvml.py) from a test, atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FAKE_DIR = Path(__file__).resolve().parent
GIB = 1 << 30


def device(index: int, *, utilization: float = 40, used: int = 2 * GIB, total: int = 80 * GIB,
           temperature: int | None = 60, power_mw: int | None = 250_000,
           error: str | None = None) -> dict[str, Any]:
    return {"uuid": f"GPU-{index:08x}-fake-0000-0000-{index:012x}", "name": "Fake H100",
            "utilization": utilization, "memory_used": used, "memory_total": total,
            "temperature": temperature, "power_mw": power_mw, "error": error}


def process(pid: int, device_index: int, used: int | None) -> dict[str, Any]:
    return {"pid": pid, "device": device_index, "used": used, "kind": "compute"}


def write_state(path: Path, devices: list[dict[str, Any]],
                processes: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
                **extra: Any) -> None:
    """Replace the state in one rename: the fake never reads half a file, and sees the new
    file by its inode."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": devices, "processes": list(processes), **extra}))
    os.replace(tmp, path)


def fake_env(state: Path) -> dict[str, str]:
    """The environment for a supervisor subprocess that should find the fake NVML."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAKE_DIR), env.get("PYTHONPATH")) if p)
    env["FAKE_NVML_STATE"] = str(state)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env
