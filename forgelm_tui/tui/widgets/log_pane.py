"""The log pane: merged or one rank, follow mode, search; fed in batches, never per line."""

from __future__ import annotations

from rich.highlighter import Highlighter
from rich.text import Text
from textual.widgets import Log

from forgelm_tui.tui.model import LOG_KEEP_MERGED, LogLine, LogStore


class StreamHighlighter(Highlighter):
    """Colours the rank prefix; stderr lines (``[rank N]!``) in red. Never parses markup."""

    def highlight(self, text: Text) -> None:
        plain = text.plain
        end = plain.find("]")
        if not plain.startswith("[rank ") or end < 0:
            return
        if plain[end + 1 : end + 2] == "!":
            text.stylize("bold red", 0, end + 2)
            text.stylize("red", end + 2)
        else:
            text.stylize("cyan", 0, end + 1)


class LogPane(Log):
    """A :class:`Log` showing either every rank (``rank=None``) or one rank."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(max_lines=LOG_KEEP_MERGED, highlight=True, auto_scroll=True,
                         **kwargs)  # type: ignore[arg-type]
        self.highlighter = StreamHighlighter()
        self.rank: int | None = None
        self.matches: list[int] = []
        self.match_index = -1
        self.query_text = ""

    def show(self, store: LogStore, rank: int | None) -> None:
        """Switch view and rebuild from the bounded history."""
        self.rank = rank
        self.clear()
        self.write_lines(line.render() for line in store.history(rank))

    def append(self, lines: list[LogLine], skipped: int) -> None:
        if skipped and self.rank is None:
            self.write_line(f"[forgelm-tui] … {skipped} lines not shown here (too fast); "
                            "the rank log files have every line")
        wanted = lines if self.rank is None else [ln for ln in lines if ln.rank == self.rank]
        if wanted:
            self.write_lines(line.render() for line in wanted)

    def search(self, query: str, backwards: bool = False) -> tuple[int, int]:
        """Move to the next (or previous) line containing ``query``; (match number, total)."""
        if query != self.query_text:
            self.query_text = query
            self.match_index = -1
        needle = query.lower()
        self.matches = [i for i, text in enumerate(self.lines) if needle in text.lower()]
        if not self.matches or not needle:
            return (0, 0)
        step = -1 if backwards else 1
        self.match_index = (self.match_index + step) % len(self.matches)
        self.auto_scroll = False
        line = self.matches[self.match_index]
        self.scroll_to(y=max(0, line - self.size.height // 2), animate=False)
        return (self.match_index + 1, len(self.matches))
