"""The run's header: state, elapsed time, the grace countdown, the verdict, the command."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from forgelm_tui.tui.model import RunModel
from forgelm_tui.tui.widgets.rank_table import human_seconds


class RunHeader(Widget):
    """Two fixed lines; repainted without a layout pass (a Static.update reflows the screen)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = Text()

    def render(self) -> Text:
        return self._text

    def render_for(self, model: RunModel, verdict_label: str | None) -> None:
        state = model.state.upper()
        style = {"RUNNING": "bold green", "STOPPING": "bold magenta",
                 "FINISHED": "bold cyan"}.get(state, "bold")
        line1 = Text.assemble(
            ("forgelm-tui ", "bold"),
            f"run {model.run_id}  ·  {model.world_size} rank(s)  ·  "
            f"elapsed {human_seconds(model.elapsed())}  ·  ",
            (state, style),
        )
        left = model.seconds_left()
        if left is not None:
            live = ",".join(str(r) for r in model.live_ranks) or "-"
            line1.append(f"  SIGKILL in {left:.0f} s (ranks {live} left): {model.stop_reason}",
                         style="magenta")
        elif model.state == "stopping" and model.stop_reason:
            line1.append(f"  {model.stop_reason}", style="magenta")
        if verdict_label:
            line1.append(f"  exit {verdict_label}", style="bold")
        line2 = Text(" ".join(model.command), style="dim", no_wrap=True, overflow="ellipsis")
        text = Text("\n").join([line1, line2])
        if text.plain != self._text.plain or text.spans != self._text.spans:
            self._text = text
            self.refresh()
