"""Finding runs for attach and ls: by run dir, run id or the newest live one (registry first,
then ./forgelm-tui-runs). Nothing here creates a run dir or an envelope."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgelm_tui.control import paths

RUNS_ROOT = Path("forgelm-tui-runs")


def process_alive(pid: int | None) -> bool:
    """A process (another user's counts) with this pid exists."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class KnownRun:
    run_id: str
    run_dir: Path
    socket: Path | None
    pid: int | None
    started_at: float | None

    @property
    def live(self) -> bool:
        """Its supervisor is alive and its socket is there."""
        if self.socket is None or not self.socket.exists():
            return False
        return process_alive(self.pid)

    def envelope(self) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ValueError):
            data: dict[str, Any] = json.loads((self.run_dir / "envelope.json").read_text())
            return data
        return None


class NotFound(Exception):
    """No such run (one line for the operator)."""


def known_runs(root: Path = RUNS_ROOT) -> list[KnownRun]:
    """The registry's runs and the run dirs under ``root``, newest first, each once."""
    runs: dict[str, KnownRun] = {}
    for entry in paths.registered():
        with contextlib.suppress(KeyError, TypeError):
            run = KnownRun(entry["run_id"], Path(entry["run_dir"]), Path(entry["socket"]),
                           entry.get("pid"), entry.get("started_at"))
            runs.setdefault(str(run.run_dir.resolve()), run)
    with contextlib.suppress(OSError):
        for envelope in root.absolute().glob("*/envelope.json"):
            run_dir = envelope.parent
            runs.setdefault(str(run_dir.resolve()), KnownRun(
                run_dir.name, run_dir, run_dir / paths.SOCKET_NAME, None,
                envelope.stat().st_mtime))
    return sorted(runs.values(), key=lambda r: r.started_at or 0.0, reverse=True)


def find_run(target: str | None, root: Path = RUNS_ROOT) -> KnownRun:
    runs = known_runs(root)
    if target is None:  # the newest live run, those started from here first
        here = Path.cwd().resolve()
        live = sorted((r for r in runs if r.live),
                      key=lambda r: not r.run_dir.resolve().is_relative_to(here))
        if not live:
            raise NotFound("no live run found (forgelm-tui ls lists the runs it knows)")
        return live[0]
    path = Path(target)
    if path.is_dir():
        resolved = str(path.resolve())
        for run in runs:
            if str(run.run_dir.resolve()) == resolved:
                return run
        if (path / "envelope.json").exists() or (path / paths.SOCKET_NAME).exists():
            return KnownRun(path.name, path, path / paths.SOCKET_NAME, None, None)
        raise NotFound(f"{target}: not a forgelm-tui run dir")
    matches = [r for r in runs if r.run_id == target] or \
        [r for r in runs if r.run_id.startswith(target)]
    if len({r.run_id for r in matches}) > 1:
        raise NotFound(f"{target}: more than one run matches "
                       f"({', '.join(sorted({r.run_id for r in matches})[:4])})")
    if not matches:
        raise NotFound(f"{target}: no such run (forgelm-tui ls lists the runs it knows)")
    return matches[0]


def ls_text(root: Path = RUNS_ROOT) -> str:
    header = ("run id", "state", "code", "ranks", "age", "run dir")
    rows = [header]
    now = time.time()
    for run in known_runs(root):
        envelope = run.envelope() if not run.live else None
        state = "running" if run.live else ("ended" if envelope else "gone")
        code = "-" if envelope is None else str(envelope.get("exit_code"))
        ranks = "-" if envelope is None else str(envelope.get("world_size"))
        age = "-" if run.started_at is None else _age(now - run.started_at)
        rows.append((run.run_id, state, code, ranks, age, str(run.run_dir)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows) + "\n"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
