"""Make untrusted child output safe to show: no escape sequences, no markup surprises."""

from __future__ import annotations

import re

MAX_LINE_CHARS = 2000
# A line is cut to this many characters before any regex runs: a 60 KB line costs a bounded
# amount of work (escape sequences may take up to 7/8 of it and the line still fills its cap).
MAX_RAW_CHARS = 8 * MAX_LINE_CHARS
# At most this many bytes of a line without its newline are held back (per rank and stream); a
# longer one is shown by this much of its head and the rest is skipped up to its newline.
MAX_PENDING_BYTES = 64 * 1024

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
    cut = len(line) > MAX_RAW_CHARS
    if cut:
        line = line[:MAX_RAW_CHARS]
    if line.isprintable():  # nothing to strip (a C-speed check, no regex): the common case
        return line[: MAX_LINE_CHARS - 1] + "…" if len(line) > MAX_LINE_CHARS else line
    line = _ESCAPES.sub("", line)
    line = _CONTROLS.sub("", line).expandtabs(4)
    if cut or len(line) > MAX_LINE_CHARS:
        line = line[: MAX_LINE_CHARS - 1] + "…"
    return line


def sanitize_block(block: bytes) -> list[str]:
    """Complete lines joined by ``\n`` (one read chunk) as sanitised lines.

    A chunk of plain short lines, the usual case, costs a few C-speed passes over the whole
    block instead of a Python call per line: a flood is 100k lines a second per rank.
    """
    text = block.decode("utf-8", "replace")
    lines = text.split("\n")
    # Lengths first: a block holding a 60 KB line skips the whole-block scan for the cheap,
    # capped one per line.
    if max(map(len, lines)) <= MAX_LINE_CHARS and text.replace("\n", "").isprintable():
        return lines
    return [sanitize_line(line) for line in lines]


class LineSplitter:
    """Turns chunks of bytes into complete lines, holding back a partial last line.

    Memory is bounded whatever the rank writes: at most ``max_pending`` bytes are held back, and
    a block it returns is at most ``max_pending`` + the chunk + 1 bytes. A line that grows past
    ``max_pending`` without a newline (a 300 MB line) is returned once, by its first
    ``max_pending`` bytes; the rest of it is skipped up to its newline, or up to a carriage return
    that starts it afresh (the rank's log file keeps every byte). Work per chunk is a few
    C-speed scans of it: nothing is copied more than once, nothing grows with the line.
    """

    def __init__(self, max_pending: int = MAX_PENDING_BYTES) -> None:
        self._pending = b""  # while skipping: nothing, or the "\r" that ended the last chunk
        self._max_pending = max_pending
        self._skipping = False

    def split(self, chunk: bytes) -> bytes | None:
        """The complete lines so far, raw and joined by newlines; None when there are none."""
        if self._skipping:
            chunk = self._skip(chunk)
            if self._skipping:
                return None
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
            # A line without end: show its head once, skip the rest (the log file has it all).
            head = self._pending[: self._max_pending]
            block = head if block is None else block + b"\n" + head
            self._pending = b"\r" if self._pending.endswith(b"\r") else b""
            self._skipping = True
        return block

    def _skip(self, chunk: bytes) -> bytes:
        """What follows the overlong line in ``chunk``; b"" while the line goes on."""
        data, self._pending = self._pending + chunk, b""
        end = data.find(b"\n")
        # A "\r" just before the newline ends the line (CRLF); one at the very end may yet be.
        redraw = data.rfind(b"\r", 0, (len(data) if end < 0 else end) - 1)
        if redraw >= 0:  # the terminal starts the line afresh: its new state is shown
            self._skipping = False
            return data[redraw + 1 :]
        if end >= 0:
            self._skipping = False
            return data[end + 1 :]
        if data.endswith(b"\r"):
            self._pending = b"\r"
        return b""

    def partial(self) -> str | None:
        """The line being redrawn with ``\r`` (a progress bar), as it shows now."""
        if not self._pending or self._skipping:
            return None
        return sanitize_line(self._pending.decode("utf-8", "replace"))

    def flush(self) -> bytes | None:
        """The partial last line at end of stream, if any."""
        rest, self._pending = self._pending, b""
        skipped, self._skipping = self._skipping, False
        if skipped or not rest:  # an overlong line already shown by its head
            return None
        return rest
