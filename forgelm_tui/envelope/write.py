"""The envelope on disk: atomic, private, each destination on its own (docs/security.md)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from forgelm_tui.private_files import error_text, make_private_dir, open_private


def write_atomic(path: Path, envelope: dict[str, Any]) -> None:
    """Write via a temp file in the same directory, fsync, rename, fsync the directory.

    The temp file is created O_EXCL | O_NOFOLLOW, 0600; the rename replaces whatever is at
    ``path`` (a planted symlink included) and never writes through it (docs/security.md).
    """
    if not path.parent.is_dir():
        make_private_dir(path.parent)
    data = (json.dumps(envelope, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
    fd = open_private(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                      | os.O_CLOEXEC)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


EnvelopeFor = Callable[[Sequence[dict[str, str]]], dict[str, Any]]


def write_all(paths: Iterable[Path], envelope_for: EnvelopeFor) -> list[str]:
    """Write to every destination; returns the errors (one line each) for those that failed."""
    return write_each(paths, envelope_for)[2]


def write_each(paths: Iterable[Path], envelope_for: EnvelopeFor
               ) -> tuple[dict[str, Any], list[str], list[str]]:
    """Write the envelope ``envelope_for(())`` builds to every destination, each on its own:
    one that fails never stops the others. When some failed, the envelope is built again
    naming them (``storage.envelope_not_written``) and the written copies are replaced by it;
    so is what goes to stdout. Returns that envelope, the paths written, and one error line
    for each that was not."""
    envelope = envelope_for(())
    written: list[str] = []
    errors: list[str] = []
    failed: list[dict[str, str]] = []
    for path in paths:
        try:
            write_atomic(path, envelope)
        except OSError as exc:
            errors.append(f"cannot write envelope {path}: {exc.strerror or exc}")
            failed.append({"path": str(path), "error": error_text(exc)})
        else:
            written.append(str(path))
    if failed:
        envelope = envelope_for(failed)
        for done in written:
            with contextlib.suppress(OSError):  # the first copy stands
                write_atomic(Path(done), envelope)
    return envelope, written, errors
