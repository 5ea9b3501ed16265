"""The key line at the bottom of the screen: the keys that do something now.

Textual's Footer recomposes itself whenever the screen's bindings change, and they change two
or three times while the app starts (first focus, screen resume): each time a compose, a mount
and a layout pass of the whole screen (25-40 ms here), just when the ranks start printing. This
line is drawn from the app's bindings once per phase of the run (running, stopping, ended) and
repaints without a layout pass. The keys come in order of use: what does not fit the width is
left off whole, from the end, never cut in the middle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.widget import Widget

PALETTE_KEY = ("^p", "Palette")
LOG_KEYS = ("toggle_rank_log", "all_logs", "follow", "search")
# Per phase: (action, description or None for the binding's own), in order of use. While
# stopping, c kills at once: "Cancel" would promise a graceful stop that has already begun.
# An action the app has no binding for is left out: "detach" shows only in an attached viewer.
PHASES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "running": (("cancel", None), ("kill", None), ("detach", None), ("help", None),
                *((a, None) for a in LOG_KEYS), ("quit_run", None)),
    "stopping": (("cancel", "Kill now"), ("detach", None), ("help", None),
                 *((a, None) for a in LOG_KEYS)),
    "ended": (("quit_run", "Quit with the code"), ("save_envelope", None), ("help", None),
              *((a, None) for a in LOG_KEYS)),
}


class KeyHints(Widget):
    def __init__(self, bindings: Iterable[BindingType], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._by_action: dict[str, Binding] = {}
        for binding in bindings:  # the first shown binding of each action names its key
            if isinstance(binding, Binding) and binding.show:
                self._by_action.setdefault(binding.action, binding)
        self.phase: tuple[str, int | None] = ("", None)
        self.keys: list[tuple[str, str]] = []
        self.show_phase("running")

    def show_phase(self, phase: str, code: int | None = None) -> None:
        """The keys of ``phase``: "running", "stopping" or "ended" (then q quits with ``code``)."""
        if (phase, code) == self.phase:
            return
        self.phase = (phase, code)
        self.keys = []
        for action, text in PHASES[phase]:
            binding = self._by_action.get(action)
            if binding is None:
                continue
            if action == "quit_run" and code is not None:
                text = f"Quit (exit {code})"
            self.keys.append((binding.key_display or _display(binding.key),
                              text or binding.description))
        self.keys.append(PALETTE_KEY)
        self.refresh()

    def render(self) -> Content:
        width = self.size.width or 1 << 16
        line = Content("")
        for key, text in self.keys:
            part = Content.assemble((key, "bold $footer-key-foreground"), " ", text)
            joined = line + "  " + part if line.cell_length else part
            if joined.cell_length > width:
                break
            line = joined
        return line


def _display(key: str) -> str:
    return {"slash": "/", "question_mark": "?", "enter": "enter"}.get(key, key)
