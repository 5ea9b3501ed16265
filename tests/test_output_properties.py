"""Property tests of rank output (issue 12 item 9): the log file gets every byte as written;
no raw control byte (ESC, other C0 controls, C1) reaches a line a terminal shows."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import rank_record
from hypothesis import given, settings
from hypothesis import strategies as st

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.output import OutputDrain
from forgelm_tui.engine.progress import ProgressReader
from forgelm_tui.engine.sanitize import MAX_LINE_CHARS, LineSplitter, sanitize_line
from forgelm_tui.engine.spawn import OutputPipes

pytestmark = pytest.mark.timeout(120)
PROPERTY = settings(derandomize=True, max_examples=200, deadline=None)
RAW = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # a tab is expanded too: nothing below 0x20 stays

PIECES = [b"\x1b[31m", b"\x1b[2K", b"\x1b]0;title\x07", b"\x1bP1$r\x1b\\", b"\x1b", b"\x9b1m",
          b"\r", b"\r\n", b"\n", b"\t", b"\x00", b"\x07", b"\x08", b"\x7f", b"a", b"line ",
          b"\xc3\xa9", b"\xe2\x80\xa6", b"\xff", b"\xc3", b"[rank0]", b"[/]", b"x" * 300]
hostile = st.lists(st.sampled_from(PIECES), max_size=60).map(b"".join)
chunks = st.lists(st.one_of(hostile, st.binary(max_size=3000)), max_size=12)


def _shown(chunk_list: list[bytes]) -> list[str]:
    """What views are shown: the splitter's blocks as lines, its partial line, its flush."""
    splitter, shown = LineSplitter(max_pending=4096), []
    for chunk in chunk_list:
        block = splitter.split(chunk)
        if block is not None:
            shown.extend(ev.RankOutput(0, ev.Stream.STDOUT, block).lines)
        partial = splitter.partial()
        if partial is not None:
            shown.append(partial)
    rest = splitter.flush()
    if rest is not None:
        shown.extend(ev.RankOutput(0, ev.Stream.STDOUT, rest).lines)
    return shown


@pytest.mark.fault("F15")
@PROPERTY
@given(chunks)
def test_nothing_raw_reaches_a_shown_line(chunk_list: list[bytes]) -> None:
    for line in _shown(chunk_list):
        assert not RAW.search(line), repr(line)
        assert len(line) <= MAX_LINE_CHARS


@PROPERTY
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
                        max_size=200), min_size=1, max_size=30), st.data())
def test_every_line_is_shown_however_it_is_chunked(lines: list[str], data: st.DataObject) -> None:
    """Without carriage returns (a redrawn bar shows only its latest state) every line is
    shown once, in order, whatever the read chunks' boundaries."""
    raw = "\n".join(lines).encode() + b"\n"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert _complete(pieces) == [sanitize_line(line) for line in lines]


def _complete(pieces: list[bytes]) -> list[str]:
    splitter, shown = LineSplitter(), []
    for piece in pieces:
        block = splitter.split(piece)
        if block is not None:
            shown.extend(ev.RankOutput(0, ev.Stream.STDOUT, block).lines)
    assert splitter.flush() is None
    return shown


def _drain(chunk_list: list[bytes], run_dir: Path) -> tuple[bytes, list[Any]]:
    """Chunks written to a real pipe, drained by the engine's OutputDrain on a real loop."""
    record = rank_record(0, run_dir)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    os.close(err_w)
    pipes = OutputPipes(out_r, err_r, [])  # the writer holds the only write end
    loop = asyncio.new_event_loop()
    events: list[Any] = []
    closed: list[int] = []

    def on_closed() -> None:
        closed.append(1)
        if len(closed) == 2:
            loop.stop()

    def write() -> None:
        with os.fdopen(out_w, "wb", buffering=0) as pipe:
            for chunk in chunk_list:
                pipe.write(chunk)

    drain = OutputDrain(loop, events.append, ProgressReader(events.append), on_closed)
    try:
        with drain.logs_for(record) as logs:
            drain.attach(record, pipes, logs)
        writer = threading.Thread(target=write)
        writer.start()
        loop.call_later(30, loop.stop)  # a deadline, never reached when the drain works
        loop.run_forever()
        writer.join(5)
    finally:
        drain.close_all()
        loop.close()
    assert len(closed) == 2, "the drain did not see both pipes end"
    return Path(record.stdout_log).read_bytes(), events


@pytest.mark.fault("F15")
@settings(derandomize=True, max_examples=40, deadline=None)
@given(st.lists(st.one_of(hostile, st.binary(max_size=20000)), max_size=10))
def test_the_log_file_gets_every_byte(chunk_list: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        on_disk, events = _drain(chunk_list, Path(tmp))
    assert on_disk == b"".join(chunk_list)
    for event in events:
        if isinstance(event, ev.RankOutput):
            assert len(event.raw) <= len(on_disk)
            for line in event.lines:
                assert not RAW.search(line), repr(line)
