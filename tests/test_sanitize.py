from __future__ import annotations

import random

import pytest

from forgelm_tui.engine.sanitize import (
    MAX_LINE_CHARS,
    MAX_RAW_CHARS,
    LineSplitter,
    sanitize_block,
    sanitize_line,
)


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


def test_a_huge_line_is_capped_after_a_bounded_amount_of_work() -> None:
    assert sanitize_line("x" * 1_000_000) == "x" * (MAX_LINE_CHARS - 1) + "…"
    # Past MAX_RAW_CHARS nothing is looked at: a line of escapes alone shows as cut.
    assert sanitize_line("\x1b[31m" * 10_000 + "late text") == "…"
    # Colour on every character: what the first MAX_RAW_CHARS show, marked as cut.
    colored = "\x1b[31ma\x1b[0m" * 5_000
    assert sanitize_line(colored) == "a" * (MAX_RAW_CHARS // 10) + "…"


def test_a_line_without_end_is_shown_once_by_its_head_and_the_rest_skipped() -> None:
    splitter = LineSplitter(max_pending=16)
    assert splitter.split(b"first\n" + b"a" * 10) == b"first"
    assert splitter.split(b"a" * 10) == b"a" * 16  # past 16 bytes: its head, once
    for _ in range(1000):  # the rest of it: nothing held, nothing returned
        assert splitter.split(b"a" * 64) is None
        assert splitter.partial() is None
    assert splitter.split(b"aaa\nnext\nnew") == b"next"
    assert splitter.flush() == b"new"


@pytest.mark.parametrize(
    ("rest", "shown"),
    [
        (b"aa\r\nok\n", [b"ok"]),  # CRLF ends the overlong line: no empty line for it
        (b"aa\rredrawn\nok\n", [b"redrawn\nok"]),  # a carriage return starts it afresh
        (b"aa\r", []),  # ...maybe: the next chunk tells
    ],
)
def test_an_overlong_line_ends_at_its_newline_or_restarts_at_a_carriage_return(
        rest: bytes, shown: list[bytes]) -> None:
    splitter = LineSplitter(max_pending=8)
    assert splitter.split(b"a" * 20) == b"a" * 8
    assert [block for block in [splitter.split(rest)] if block] == shown


def test_a_carriage_return_at_a_chunk_edge_while_skipping() -> None:
    splitter = LineSplitter(max_pending=8)
    splitter.split(b"a" * 20)
    assert splitter.split(b"aa\r") is None
    assert splitter.split(b"\nok\n") == b"ok"  # it was a CRLF
    splitter.split(b"a" * 20)
    assert splitter.split(b"aa\r") is None
    assert splitter.split(b"bar 50%\n") == b"bar 50%"  # it was a redraw
    splitter.split(b"a" * 20)
    assert splitter.split(b"aa\r") is None
    assert splitter.flush() is None  # the end of the stream in the middle of it


def test_blocks_and_pending_stay_within_their_bounds() -> None:
    """Random chunks of lines of every length: nothing held past max_pending, every block at
    most max_pending + the chunk + 1 bytes, and each line comes through once: whole, or (when
    it outgrew max_pending before its newline came) by its head."""
    rng = random.Random(7)
    for _ in range(200):
        splitter = LineSplitter(max_pending=32)
        lines = [bytes(rng.choice(b"xyz") for _ in range(rng.choice((0, 5, 31, 32, 33, 200))))
                 for _ in range(30)]
        data = b"\n".join(lines) + b"\n"
        got: list[bytes] = []
        at = 0
        while at < len(data):
            size = rng.randint(1, 80)
            block = splitter.split(data[at : at + size])
            at += size
            assert len(splitter._pending) <= 32
            if block is not None:
                assert len(block) <= 32 + size + 1
                got.extend(block.split(b"\n"))
        assert splitter.flush() is None
        assert len(got) == len(lines)
        for line, shown in zip(lines, got, strict=True):
            assert shown == line or (len(line) > 32 and shown == line[:32])


@pytest.mark.fault("F14")
def test_a_300_mb_line_is_one_head() -> None:
    splitter = LineSplitter()
    chunk = b"q" * 65_536
    blocks = [block for block in (splitter.split(chunk) for _ in range(4_600)) if block]
    assert blocks == [chunk]
