"""The key line at the bottom of the screen, drawn once.

Textual's Footer recomposes itself whenever the screen's bindings change, and they change two
or three times while the app starts (first focus, screen resume): each time a compose, a mount
and a layout pass of the whole screen (25-40 ms here), just when the ranks start printing. The
keys of this screen never change, so a line drawn once says the same for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.widgets import Static

PALETTE_KEY = ("^p", "Palette")


class KeyHints(Static):
    def __init__(self, bindings: Iterable[BindingType], **kwargs: str | None) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._keys = [(b.key_display or _display(b.key), b.description)
                      for b in bindings if isinstance(b, Binding) and b.show]
        self._keys.append(PALETTE_KEY)

    def on_mount(self) -> None:
        parts = [Content.assemble((key, "bold $footer-key-foreground"), " ", text)
                 for key, text in self._keys]
        self.update(Content("  ").join(parts))


def _display(key: str) -> str:
    return {"slash": "/", "question_mark": "?", "enter": "enter"}.get(key, key)
