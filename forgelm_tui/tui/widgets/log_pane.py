"""The log pane: merged or one rank, follow mode, search; fed in batches, never per line.

A Line API widget: it renders only the visible lines, and growing never costs a layout pass.
Textual's ``Log`` sets ``virtual_size``, a layout reactive, on every write (and again from a
width-measuring thread): each flush while the history fills reflowed the whole screen, rank
table included, which was a third of the TUI's CPU in a log flood. Here the size is set without
watchers and only the pane and its scrollbars repaint; the scrollbars are always shown
(``overflow: scroll``), so whether they are shown never changes either.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.selection import Selection
from textual.strip import Strip
from textual.widget import Widget

from forgelm_tui.tui.logs import LOG_KEEP_MERGED, LogLine, LogStore

# Characters of text kept: at most 8 MiB of str (a line cut at 2000 characters ends in "…", so
# Python stores it at two bytes a character; four for text beyond the BMP).
LOG_PANE_MAX_CHARS = 4 << 20
MATCH_STYLE = Style(color="black", bgcolor="yellow", bold=True)  # the current search match


def stream_text(line: str) -> Text:
    """The rank prefix coloured; stderr lines (``[rank N]!``) in red. Never parses markup."""
    text = Text(line, no_wrap=True)
    end = line.find("]")
    if not line.startswith("[rank ") or end < 0:
        return text
    if line[end + 1 : end + 2] == "!":
        text.stylize("bold red", 0, end + 2)
        text.stylize("red", end + 2)
    else:
        text.stylize("cyan", 0, end + 1)
    return text


def _single_cells(line: str) -> bool:
    """Every character one cell wide: ASCII (sanitised, so printable), maybe a final "…"."""
    return line.isascii() or (line[-1] == "…" and line[:-1].isascii())


class LogPane(ScrollView, can_focus=True):
    """Every rank's lines (``rank=None``) or one rank's: the newest ``max_lines`` of them, and
    no more than ``max_chars`` characters in all (lines can be 2000 characters each).

    Following (``auto_scroll``) means the newest line stays in view. Scrolling up by hand pauses
    it and scrolling back to the end resumes it, as a pager does; each change is posted as
    :class:`FollowChanged` so the title never says "following" over an old page.
    """

    class FollowChanged(Message):
        def __init__(self, following: bool) -> None:
            super().__init__()
            self.following = following

    ALLOW_SELECT = True
    BINDINGS = [Binding("end", "follow_newest", "Follow", show=False)]
    DEFAULT_CSS = """
    LogPane {
        overflow: scroll;  /* never a layout pass for a scrollbar appearing: see the module */
    }
    """

    def __init__(self, max_lines: int = LOG_KEEP_MERGED, max_chars: int = LOG_PANE_MAX_CHARS,
                 **kwargs: str | None) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.max_lines = max_lines
        self.max_chars = max_chars
        self.auto_scroll = True
        self.rank: int | None = None
        self.matches: list[int] = []
        self.match_index = -1
        self.query_text = ""
        self._lines: list[str] = []
        self._chars = 0  # characters in _lines
        self._first = 0  # the line number of _lines[0] since the last clear: cache keys
        self._width = 0
        self._strips: LRUCache[tuple[int, int, int], Strip] = LRUCache(1024)
        self._scrolling = False  # a scroll of the pane's own (follow, search): not the reader's
        self._match_key: int | None = None  # the current match's line number since the clear

    @property
    def lines(self) -> Sequence[str]:
        return self._lines

    # ------------------------------------------------------------------ content

    def show(self, store: LogStore, rank: int | None) -> None:
        """Switch view and rebuild from the bounded history."""
        self.rank = rank
        self.clear()
        self.write_lines(line.render() for line in store.history(rank))

    def append(self, lines: list[LogLine], skipped: int) -> None:
        if skipped and self.rank is None:
            self.write_lines([f"[forgelm-tui] … {skipped} lines not shown here (too fast); "
                              "the rank log files have every line"])
        wanted = lines if self.rank is None else [ln for ln in lines if ln.rank == self.rank]
        if wanted:
            self.write_lines(line.render() for line in wanted)

    def clear(self) -> None:
        self._lines.clear()
        self._chars = 0
        self._first = 0
        self._width = 0
        self._strips.clear()
        self._drop_selection()
        self._resize()
        self._scroll_myself(0, x=0)
        self.refresh()

    def write_lines(self, lines: Iterable[str]) -> None:
        new = list(lines)
        if not new:
            return
        # A reader's scroll still animating (PgUp, the wheel) wins over following: jumping to
        # the end here would cancel it before its first step could pause the pane.
        follow = self.auto_scroll and not (
            self.is_mounted and self.app.animator.is_being_animated(self, "scroll_y"))
        self._lines.extend(new)
        self._chars += sum(map(len, new))
        self._width = max(self._width, max(map(cell_len, new)))
        pruned = self._prune()
        if pruned > 0:
            self._first += pruned
            self._drop_selection()  # it was made of line numbers that now mean other lines
        self._resize()
        if follow:
            self._scroll_myself(self.max_scroll_y)
        elif pruned > 0:  # keep the same lines in view while they last
            self._scroll_myself(max(0, self.scroll_y - pruned))
        self.refresh()

    def _prune(self) -> int:
        """Drop the oldest lines past ``max_lines`` or ``max_chars``; how many went."""
        count = max(0, len(self._lines) - self.max_lines)
        chars = self._chars - sum(map(len, itertools.islice(self._lines, count)))
        while chars > self.max_chars and count < len(self._lines) - 1:
            chars -= len(self._lines[count])  # a Python step per line dropped, never per kept
            count += 1
        if count:
            del self._lines[:count]
            self._chars = chars
        return count

    def set_follow(self, following: bool) -> None:
        if following != self.auto_scroll:
            self.auto_scroll = following
            self.post_message(self.FollowChanged(following))
        if following:
            self._scroll_myself(self.max_scroll_y)

    def action_follow_newest(self) -> None:
        """End: back to the newest line, and stay there (lines arriving while a scroll to the
        end animates would otherwise leave it one page short, paused)."""
        self.set_follow(True)

    def _scroll_myself(self, y: float, x: float | None = None) -> None:
        self._scrolling = True
        try:
            self.scroll_to(x=x, y=y, animate=False, immediate=True)
        finally:
            self._scrolling = False

    def _drop_selection(self) -> None:
        if self.is_mounted and self.text_selection is not None:
            screen = self.screen
            screen.selections = {w: sel for w, sel in screen.selections.items() if w is not self}

    def on_resize(self) -> None:
        if self.auto_scroll:  # a smaller pane: the newest line back at the bottom
            self._scroll_myself(self.max_scroll_y)

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size,
                      layout: bool = True) -> bool:
        # Textual sends Resize only when a reflow finds the region changed since its previous
        # map; a pane shrunk by a neighbour mounting (the loss curves) can get its new size here
        # with no Resize after it, and a following pane then stays a line short of the newest.
        changed = super()._size_updated(size, virtual_size, container_size, layout)
        if self.auto_scroll and round(self.scroll_y) != self.max_scroll_y:
            self._scroll_myself(self.max_scroll_y)
        return changed

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._scrolling:
            return
        at_end = round(new_value) >= self.max_scroll_y
        if self.auto_scroll and not at_end and new_value < old_value:
            self.set_follow(False)  # the reader scrolled up: keep their page still
        elif not self.auto_scroll and at_end and new_value > old_value:
            self.set_follow(True)  # back at the newest line: follow again

    def _resize(self) -> None:
        size = Size(self._width, len(self._lines))
        if size == self.virtual_size:
            return
        self.set_reactive(Widget.virtual_size, size)  # no watchers: no layout pass
        if self.is_mounted:
            self.vertical_scrollbar.window_virtual_size = size.height
            self.horizontal_scrollbar.window_virtual_size = size.width

    # ------------------------------------------------------------------ rendering

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if index >= len(self._lines):
            return Strip.blank(width, style)
        line = self._lines[index]
        start, end = 0, 0  # the whole line
        if len(line) > width and _single_cells(line):
            start, end = scroll_x, scroll_x + width  # only what shows: see _strip
        strip = self._strip(index, style, start, end)
        return strip.crop_extend(scroll_x - start, scroll_x - start + width,
                                 style).apply_offsets(scroll_x, index)

    def _strip(self, index: int, style: Style, start: int, end: int) -> Strip:
        """Line ``index`` rendered, whole (``end`` 0) or its cells ``start:end``.

        A wide line is rendered only where it shows: a whole 2000-character strip, cropped to
        the pane, leaves copies of the line in rich's cache of split segments (16k entries, up
        to ~100 MB of a flood of wide lines), and a whole one kept here costs as much again.
        """
        selection = self.text_selection
        line_key = self._first + index
        key = (line_key, start, end)
        if selection is None and (cached := self._strips.get(key)) is not None:
            return cached
        line = self._lines[index]
        text = stream_text(line)
        text.stylize_before(style)
        if line_key == self._match_key and self.query_text:
            text.highlight_words([self.query_text], MATCH_STYLE, case_sensitive=False)
        if selection is not None and (span := selection.get_span(index)) is not None:
            chosen, until = span
            text.stylize(self.screen.get_component_rich_style("screen--selection"),
                         chosen, len(text) if until == -1 else until)
        if end:
            text = text[start:end]  # cells are characters here (_single_cells)
        strip = Strip(text.render(self.app.console), text.cell_len)
        if selection is None:
            self._strips[key] = strip
        return strip

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract("\n".join(self._lines)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self._strips.clear()
        self.refresh()

    # ------------------------------------------------------------------ search

    def search(self, query: str, backwards: bool = False) -> tuple[int, int]:
        """Move to the next (or previous) line containing ``query``, show it (scrolled into view,
        the query highlighted); (match number, total). An empty query clears the search."""
        if query != self.query_text:
            self.query_text = query
            self.match_index = -1
        needle = query.lower()
        self.matches = [i for i, text in enumerate(self._lines) if needle in text.lower()]
        if not self.matches or not needle:
            self._show_match(None)
            return (0, 0)
        step = -1 if backwards else 1
        self.match_index = (self.match_index + step) % len(self.matches)
        self.set_follow(False)
        line = self.matches[self.match_index]
        self._show_match(line)
        column = self._lines[line].lower().find(needle)
        width = self.scrollable_content_region.width
        x = 0 if column + len(needle) <= width else max(0, column - width // 3)
        self._scroll_myself(max(0, line - self.size.height // 2), x=x)
        return (self.match_index + 1, len(self.matches))

    def clear_search(self) -> None:
        self.query_text, self.matches, self.match_index = "", [], -1
        self._show_match(None)

    def _show_match(self, line: int | None) -> None:
        self._match_key = None if line is None else self._first + line
        self._strips.clear()
        self.refresh()
