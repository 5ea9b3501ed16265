"""Where a run's control socket is, and the per-user registry that finds runs from anywhere."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

SOCKET_NAME = "control.sock"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with its NUL


def socket_path(run_dir: Path, run_id: str) -> Path:
    """``<run dir>/control.sock``; a run dir too deep for a Unix socket path gets a short one in
    a private directory of the user's (XDG_RUNTIME_DIR, else /tmp/forgelm-tui-<uid>), named
    from the run id and a hash of the run dir, and recorded in the registry."""
    wanted = run_dir / SOCKET_NAME
    if len(os.fsencode(wanted)) <= MAX_SOCKET_PATH:
        return wanted
    import hashlib  # here: hashlib loads OpenSSL's libcrypto, megabytes of every run's RSS

    digest = hashlib.sha256(os.fsencode(run_dir)).hexdigest()[:16]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    bases = [Path(runtime) / "forgelm-tui"] if runtime else []
    bases.append(Path(tempfile.gettempdir()) / f"forgelm-tui-{os.getuid()}")
    for base in bases:
        short = base / "sockets" / f"{digest}.sock"
        if len(os.fsencode(short)) <= MAX_SOCKET_PATH:
            return private_dir(base, "sockets") / short.name
    raise OSError(f"no socket path of at most {MAX_SOCKET_PATH} bytes for {run_dir}")


def private_dir(base: Path, name: str) -> Path:
    """A directory only this user can enter (created 0700; refused if someone else owns it)."""
    path = base / name
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for part in (base, path):
        info = part.stat()
        if info.st_uid != os.getuid():
            raise PermissionError(f"{part} belongs to another user")
        if info.st_mode & 0o077:
            part.chmod(0o700)
    return path


def registry_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    path = Path(state) / "forgelm-tui" / "runs"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def register(run_id: str, entry: dict[str, Any]) -> Path | None:
    """Record a live run for attach, ls and serve; None when the registry cannot be written
    (a read-only home): the run goes on, only finding it by id does not work."""
    try:
        path = registry_dir() / f"{run_id}.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8", opener=_private) as handle:
            json.dump(entry, handle)
        os.replace(tmp, path)
        _prune(path.parent)
        return path
    except OSError:
        return None


KEEP = 200  # registry entries kept (newest first); run dirs themselves are never touched


def _prune(directory: Path) -> None:
    entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        with contextlib.suppress(OSError):
            old.unlink()


def registered() -> list[dict[str, Any]]:
    """Every run the registry knows, newest first."""
    entries = []
    with contextlib.suppress(OSError):
        for path in registry_dir().glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                entries.append(json.loads(path.read_text(encoding="utf-8")))
    return sorted(entries, key=lambda e: e.get("started_at") or 0, reverse=True)


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)
