"""Make untrusted child output safe to show: no escape sequences, no markup surprises."""

from __future__ import annotations

import re

MAX_LINE_CHARS = 2000

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte ESC sequences, and the
# 8-bit CSI introducer.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x1b"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def sanitize_line(raw: str) -> str:
    """One line of child output as plain, printable text.

    Keeps only what a terminal would finally show after carriage returns (progress bars),
    drops escape sequences and control characters, expands tabs and caps the length.
    """
    line = raw.rstrip("\r\n")
    if "\r" in line:
        line = line.rsplit("\r", 1)[1]
    if line.isprintable() and len(line) <= MAX_LINE_CHARS:
        return line  # the common case: nothing to strip (a C-speed check, no regex)
    line = _ESCAPES.sub("", line)
    line = _CONTROLS.sub("", line).expandtabs(4)
    if len(line) > MAX_LINE_CHARS:
        line = line[: MAX_LINE_CHARS - 1] + "…"
    return line


def sanitize_block(block: bytes) -> list[str]:
    """Complete lines joined by ``\n`` (one read chunk) as sanitised lines.

    A chunk of plain short lines, the usual case, costs a few C-speed passes over the whole
    block instead of a Python call per line: a flood is 100k lines a second per rank.
    """
    text = block.decode("utf-8", "replace")
    lines = text.split("\n")
    if text.replace("\n", "").isprintable() and max(map(len, lines)) <= MAX_LINE_CHARS:
        return lines
    return [sanitize_line(line) for line in lines]


class LineSplitter:
    """Turns chunks of bytes into complete lines, holding back a partial last line."""

    def __init__(self, max_pending: int = 64 * 1024) -> None:
        self._pending = b""
        self._max_pending = max_pending

    def split(self, chunk: bytes) -> bytes | None:
        """The complete lines so far, raw and joined by newlines; None when there are none."""
        data = self._pending + chunk
        end = data.rfind(b"\n")
        block: bytes | None = None
        if end >= 0:
            block, self._pending = data[:end], data[end + 1 :]
        else:
            self._pending = data
        cut = self._pending.rfind(b"\r", 0, len(self._pending) - 1)
        if cut >= 0:  # a progress bar redrawing itself: only its latest state matters
            self._pending = self._pending[cut + 1 :]
        if len(self._pending) > self._max_pending:
            # A line without end (a progress bar that never prints \n): show what we have.
            block = self._pending if block is None else block + b"\n" + self._pending
            self._pending = b""
        return block

    def partial(self) -> str | None:
        """The line being redrawn with ``\r`` (a progress bar), as it shows now."""
        if not self._pending:
            return None
        return sanitize_line(self._pending.decode("utf-8", "replace"))

    def flush(self) -> bytes | None:
        """The partial last line at end of stream, if any."""
        if not self._pending:
            return None
        rest, self._pending = self._pending, b""
        return rest
