"""Did a rank that exited 1 crash? An uncaught Python exception, told apart from a deliberate exit.

Python exits 1 both for ``sys.exit(1)`` (ForgeLM's config error: no traceback) and for an
uncaught exception (a traceback). Under the ``forgelm`` contract the second is a crash, 2
(SPEC §5), so the verdict needs to know which it was. Two places say so, read once at the end:

- the rank's ``TORCHELASTIC_ERROR_FILE``: a ``@record``-decorated rank writes it only for an
  uncaught exception (never for ``SystemExit``), ``{"message": {"message": "Type: text"}}``;
- the end of its stderr log: the interpreter prints ``Traceback (most recent call last):``,
  the frames (indented), then ``Type: message`` as its last words. Once a process group is
  initialised, torch's excepthook prefixes each of those lines with ``[rankN]: ``.

Cheap: the error file is small and at most :data:`TAIL_BYTES` of the log are read, only for
ranks that exited 1. The verdict itself stays pure: it gets the answer in ``RankEnding.crash``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from forgelm_tui.engine.records import RankRecord
from forgelm_tui.engine.sanitize import sanitize_line

TAIL_BYTES = 64 * 1024  # of a rank's stderr log: where the interpreter's last words are
TRAILING_LINES = 40  # lines after the exception line still "at the end" (a long message,
# a library's exit-time warnings); an older traceback, followed by more output, is not a crash
MESSAGE_CHARS = 300  # the exception's message as the verdict keeps it (its first line)
TRACEBACK = "Traceback (most recent call last):"
EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?$")
TORCH_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.MULTILINE)  # torch.distributed's excepthook
CRASH_EXIT = 1  # what Python exits with after an uncaught exception


def note_crashes(records: Iterable[RankRecord]) -> None:
    """Fill ``crash`` on each rank that ended with exit 1 and left a Python traceback."""
    for record in records:
        if record.exit_code == CRASH_EXIT and record.ended_mono is not None:
            record.crash = find_crash(record.error_file, record.stderr_log)


def find_crash(error_file: str, stderr_log: str) -> tuple[str, str] | None:
    """(type, message) of the uncaught exception a rank died of, or None (a deliberate exit)."""
    return from_error_file(error_file) or from_stderr(_tail(stderr_log))


@dataclass(frozen=True)
class ErrorFile:
    """What a ``@record``-decorated rank left in its ``TORCHELASTIC_ERROR_FILE`` (torch's
    ``{"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``,
    or a bare message): read here, and only here."""

    message: Any
    traceback: Any = None
    timestamp: Any = None


def read_error_file(path: str) -> ErrorFile | None:
    """The rank's error file; None if it is missing or not JSON."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, dict):
        return ErrorFile(message)
    extra = message.get("extraInfo") or {}
    if not isinstance(extra, dict):
        extra = {}
    return ErrorFile(message.get("message"), extra.get("py_callstack"), extra.get("timestamp"))


def from_error_file(path: str) -> tuple[str, str] | None:
    found = read_error_file(path)
    message = None if found is None else found.message
    if not isinstance(message, str) or not message.strip():
        return None
    return _split(message.strip().splitlines()[0])


def from_stderr(text: str) -> tuple[str, str] | None:
    """The exception of the last traceback, if the stderr ends with it (within a few lines)."""
    lines = TORCH_PREFIX.sub("", text).splitlines()
    # The header ends its line; output the rank left without a newline may come before it.
    header = next((i for i in range(len(lines) - 1, -1, -1)
                   if lines[i].rstrip().endswith(TRACEBACK)), None)
    if header is None:
        return None
    for index in range(header + 1, len(lines)):
        line = lines[index]
        if not line.strip() or line[0].isspace():
            continue  # a frame, its source line, its carets
        if len(lines) - index - 1 > TRAILING_LINES:
            return None  # an old traceback (logged, handled): the rank went on after it
        return _split(line)
    return None


def _split(line: str) -> tuple[str, str] | None:
    clean = sanitize_line(line).strip()
    match = EXCEPTION_LINE.match(clean)
    if match is None:
        return None
    return match.group(1), (match.group(2) or "").strip()[:MESSAGE_CHARS]


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
