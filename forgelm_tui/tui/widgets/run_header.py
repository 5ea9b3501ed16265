"""The run's header: state, the grace countdown, the verdict, the pace (steps/s, ETA), elapsed
time; then the command; then, once GPUs were sampled, each device's figures
(``gpu0 87% 30.0/80.0 GiB 61C 250 W``).

The first line never wraps: when it does not fit, its least useful parts go first (the name, the
run id, the rank count...), and the state, the countdown and the exit code stay. The command is
the second line, elided when it is too long, and dropped when the screen is short (CSS).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from rich.text import Text
from textual.widget import Widget

from forgelm_tui.engine.events import GpuDevice
from forgelm_tui.tui.attempt import attempt_label
from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.progress_view import rate_text, run_pace
from forgelm_tui.tui.units import human_seconds
from forgelm_tui.wording.gpu import devices_line

GAPS = {"·": ("  ·  ", " · "), "  ": ("  ", " "), " ": (" ", " ")}  # (wide, narrow)
STATE_STYLES = {"RUNNING": "bold green", "STOPPING": "bold magenta", "FINISHED": "bold cyan"}


class Part(NamedTuple):
    """A piece of the first line; ``drop`` orders which go first (0: never), ``gap`` joins it
    to the piece before: "·" a separator, "  " a pause, " " within one statement."""

    text: str
    style: str = ""
    drop: int = 0
    gap: str = "·"


def _live(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 4:
        return f"({len(ranks)} ranks left)"
    return f"(rank{'s' if len(ranks) != 1 else ''} {','.join(map(str, ranks)) or '-'} left)"


def header_parts(model: RunModel, verdict_label: str | None) -> list[Part]:
    state = model.state.upper()
    parts = [Part("forgelm-tui", "bold", 5), Part(state, STATE_STYLES.get(state, "bold"), 0, "  ")]
    attempt = attempt_label(model.attempt)
    if attempt:
        parts.append(Part(attempt, "bold yellow", 0, "  "))
    left = model.seconds_left()
    if left is not None:
        parts += [Part(f"SIGKILL in {left:.0f} s", "bold magenta", 0, "  "),
                  Part(_live(model.live_ranks), "magenta", 1, " ")]
    if model.state == "stopping" and model.stop_reason:
        parts.append(Part(model.stop_reason, "magenta", 2))
    if verdict_label:
        parts.append(Part(f"exit {verdict_label}", "bold", 0, "  "))
    parts += _pace(model)
    parts += [Part(f"elapsed {human_seconds(model.elapsed())}", "", 2),
              Part(f"{model.world_size} rank{'s' if model.world_size != 1 else ''}", "", 3),
              Part(f"run {model.run_id}", "", 4)]
    return parts


def _pace(model: RunModel) -> list[Part]:
    """While the run runs: the slowest live rank's steps/s and when the last one will be done
    (docs/progress.md); gone first after the run id and the rank count."""
    pace = run_pace(model.ranks.values(), model.clock()) if model.state == "running" else None
    if pace is None:
        return []
    eta = "ETA -" if pace.eta is None else f"ETA {human_seconds(pace.eta)}"
    return [Part(rate_text(pace.rate), "", 3), Part(eta, "bold", 2, " ")]


def _join(parts: list[Part], wide: bool) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for index, part in enumerate(parts):
        if index:
            text.append(GAPS[part.gap][0 if wide else 1])
        text.append(part.text, style=part.style)
    return text


def fit_line(parts: list[Part], width: int) -> Text:
    """One line in ``width`` cells: wide gaps, then narrow ones, then without the parts that go
    first; an ellipsis only when even the parts that never go do not fit."""
    kept = list(parts)
    while True:
        for wide in (True, False):
            line = _join(kept, wide)
            if line.cell_len <= width:
                return line
        droppable = [p for p in kept if p.drop]
        if not droppable:
            line.truncate(width, overflow="ellipsis")
            return line
        kept.remove(max(reversed(droppable), key=lambda p: p.drop))


class RunHeader(Widget):
    """Two fixed lines; repainted without a layout pass (a Static.update reflows the screen)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._parts: list[Part] = []
        self._command = ""
        self._gpus: tuple[GpuDevice, ...] = ()  # a third line, each device's figures

    def render(self) -> Text:
        width = self.size.width or 80
        command = Text(self._command, style="dim", no_wrap=True, overflow="ellipsis")
        command.truncate(width, overflow="ellipsis")
        lines = [fit_line(self._parts, width), command]
        if self._gpus:
            gpus = Text(devices_line(self._gpus, width), no_wrap=True, overflow="ellipsis")
            gpus.truncate(width, overflow="ellipsis")
            lines.append(gpus)
        return Text("\n", no_wrap=True).join(lines)

    def render_for(self, model: RunModel, verdict_label: str | None) -> None:
        parts, command = header_parts(model, verdict_label), " ".join(model.command)
        gpus = model.gpu.devices
        if parts != self._parts or command != self._command or gpus != self._gpus:
            self._parts, self._command, self._gpus = parts, command, gpus
            self.set_class(bool(gpus), "-gpu")  # three lines (CSS): a layout pass, once
            self.refresh()
