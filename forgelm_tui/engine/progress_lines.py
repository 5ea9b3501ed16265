"""Progress read from the ranks' own output, for programs that do not use the channel.

HF Trainer's tqdm bar on stderr (`` 40%|████      | 2/5 [00:01<00:01, 1.9it/s]``) gives step and
total; its log dicts (``{'loss': '3.9', ...}`` or ``{'loss': 3.9, ...}``) give the loss.
Lightning's ``Received SIGTERM`` line says a rank stopped on a signal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from forgelm_tui.engine.sanitize import sanitize_line

_BAR = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")
_LOSS = re.compile(r"""['"]loss['"]\s*:\s*['"]?([-+0-9.eE]+|nan|inf)""")
LIGHTNING_SIGTERM = b"Received SIGTERM"


def parse_step(line: str) -> tuple[int, int] | None:
    match = _BAR.search(line)
    if match is None:
        return None
    step, total = int(match.group(1)), int(match.group(2))
    return (step, total) if total > 0 and step <= total else None


def parse_loss(line: str) -> float | None:
    match = _LOSS.search(line)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


def lines_with(raw: bytes, needle: bytes, *also: bytes) -> Iterator[str]:
    """The lines of ``raw`` (newline-joined) that contain ``needle`` and every one of ``also``,
    newest first, sanitised.

    Lines are told apart as bytes; only the ones that match are decoded, and a caller that stops
    at the first useful one (the latest progress) never looks further back.
    """
    end = len(raw)
    while (at := raw.rfind(needle, 0, end)) >= 0:
        start = raw.rfind(b"\n", 0, at) + 1
        stop = raw.find(b"\n", at, end)
        line = raw[start : end if stop < 0 else stop]
        if all(word in line for word in also):
            yield sanitize_line(line.decode("utf-8", "replace"))
        end = start
