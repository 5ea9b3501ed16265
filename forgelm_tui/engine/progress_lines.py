"""Progress read from the ranks' own output, for programs that do not use the channel.

A tqdm bar (`` 40%|████      | 2/5 [00:01<00:01, 1.9it/s]``) gives step and total, but only a
*training* bar is the training step (docs/progress.md, "Which bar is the training step"):

- a loop bar counts iterations: its rate is in ``it/s`` or ``s/it``. Data-processing bars count
  something else (datasets' ``Map: ... examples/s``, downloads in ``B/s``): never steps;
- a training bar has no description (HF Trainer's) or ``Epoch N`` (Lightning's tqdm bar), and is
  not drawn nested under another bar (tqdm moves the cursor up after a nested bar: HF's
  evaluation bar during training, Lightning's validation bar);
- of the bars without a description, the training bar is the one with the largest total: HF
  Trainer's evaluation loops (a baseline before training, ``evaluate()`` after it) run over the
  evaluation set, its training bar over ``max_steps``.

Every other loop bar (an evaluation, loading weights) that advances is a sign of life of the
program, never its step. HF Trainer's log dicts (``{'loss': '3.9', ...}``) give the loss;
Lightning's ``Received SIGTERM`` line says a rank stopped on a signal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from forgelm_tui.engine.sanitize import sanitize_line

_BAR = re.compile(r"\s*(?:(?P<label>.*?):\s*)?\d{1,3}%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)"
                  r"\s*\[(?P<info>[^\]]*)\]")
_LOOP_RATE = re.compile(r"(?:it/s|s/it)\b")  # tqdm's default unit, "it" (iterations)
_EPOCH = re.compile(r"Epoch \d+")  # Lightning's training bar
_NESTED = b"\x1b[A"  # tqdm's cursor-up after a bar drawn below another
_LOSS = re.compile(r"""['"]loss['"]\s*:\s*['"]?([-+0-9.eE]+|nan|inf)""")
LIGHTNING_SIGTERM = b"Received SIGTERM"


@dataclass(frozen=True)
class Bar:
    """A loop bar as it shows now: ``label`` is its description ("" for none)."""

    label: str
    step: int
    total: int
    nested: bool = False

    def is_training(self, training_total: int | None) -> bool:
        """Is this the training bar, given the total of the training bar seen so far?"""
        if self.nested:
            return False
        if _EPOCH.fullmatch(self.label):
            return True
        return self.label == "" and self.total >= (training_total or 0)


def parse_bar(raw: bytes) -> Bar | None:
    """The loop bar a raw output line shows now (its text after the last carriage return)."""
    segment = raw.rstrip(b"\r\n").rsplit(b"\r", 1)[-1]
    match = _BAR.match(sanitize_line(segment.decode("utf-8", "replace")))
    if match is None or _LOOP_RATE.search(match["info"]) is None:
        return None
    step, total = int(match["step"]), int(match["total"])
    if total <= 0 or step > total:
        return None
    return Bar(match["label"] or "", step, total, segment.rstrip().endswith(_NESTED))


def parse_step(line: str) -> tuple[int, int] | None:
    """A training bar's step and total, from one line of text."""
    bar = parse_bar(line.encode())
    return (bar.step, bar.total) if bar is not None and bar.is_training(None) else None


def parse_loss(line: str) -> float | None:
    match = _LOSS.search(line)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


def raw_lines_with(raw: bytes, needle: bytes, *also: bytes) -> Iterator[bytes]:
    """The lines of ``raw`` (newline-joined) that contain ``needle`` and every one of ``also``,
    newest first, as written.

    Lines are told apart as bytes, and a caller that stops at the first useful one (the latest
    progress) never looks further back.
    """
    end = len(raw)
    while (at := raw.rfind(needle, 0, end)) >= 0:
        start = raw.rfind(b"\n", 0, at) + 1
        stop = raw.find(b"\n", at, end)
        line = raw[start : end if stop < 0 else stop]
        if all(word in line for word in also):
            yield line
        end = start


def lines_with(raw: bytes, needle: bytes, *also: bytes) -> Iterator[str]:
    """:func:`raw_lines_with`, each line sanitised (only the ones that match are decoded)."""
    for line in raw_lines_with(raw, needle, *also):
        yield sanitize_line(line.decode("utf-8", "replace"))
