from __future__ import annotations

import pytest

from forgelm_tui.engine.sanitize import MAX_LINE_CHARS, LineSplitter, sanitize_block, sanitize_line


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[1;31mred\x1b[0m", "red"),
        ("10%\r50%\r100%", "100%"),
        ("done\r\n", "done"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("[bold]x[/]", "[bold]x[/]"),
        ("a\x00b\x07c", "abc"),
        ("\x9b31mcsi8", "csi8"),
        ("t\tab", "t   ab"),
    ],
)
def test_sanitize_line(raw: str, shown: str) -> None:
    assert sanitize_line(raw) == shown


def test_long_lines_are_capped() -> None:
    assert len(sanitize_line("x" * 10_000)) == MAX_LINE_CHARS


def test_splitter_holds_partial_lines_until_complete() -> None:
    splitter = LineSplitter()
    assert splitter.split(b"ab") is None
    assert splitter.split(b"c\nde") == b"abc"
    assert splitter.split("\u00e9\n".encode()[:1]) is None
    assert sanitize_block(splitter.split("\u00e9\n".encode()[1:]) or b"") == ["de\u00e9"]
    assert splitter.split(b"tail") is None
    assert splitter.flush() == b"tail"
    assert splitter.flush() is None


def test_progress_bar_redraws_keep_only_the_latest_state() -> None:
    splitter = LineSplitter()
    for step in range(1, 1000):
        assert splitter.split(f"\r{step}/999 [".encode()) is None
    assert splitter.partial() == "999/999 ["
    assert splitter.split(b"\n") == b"999/999 ["
    assert splitter.partial() is None


@pytest.mark.parametrize(
    "chunk",
    [
        b"plain\nlines\n\nwith an empty one\n",
        b"ok\n\x1b[31mred\x1b[0m\nok again\n",
        b"bar 10%\rbar 100%\ndone\r\n",
        b"caf\xc3\xa9 \xff broken utf-8\n",
        b"x" * (MAX_LINE_CHARS + 5) + b"\nshort\n",
        b"tab\there\n[bold]markup[/]\n",
    ],
)
def test_a_chunk_gives_the_same_lines_as_line_by_line(chunk: bytes) -> None:
    """The whole-chunk fast path may never show anything sanitize_line would not."""
    expected = [sanitize_line(part.decode("utf-8", "replace")) for part in chunk.split(b"\n")[:-1]]
    assert sanitize_block(LineSplitter().split(chunk) or b"") == expected
