"""Memory is bounded in bytes on the way from a rank's pipe to a view, and the logs keep it all.

The CLI runs are measured against a baseline of the same shape whose ranks print nothing, in
the same test: the supervisor's peak RSS (VmHWM) is read while it is still alive, after it has
drained every byte into the log files and before the ranks are allowed to exit.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import rank_script, start, wait_for
from scripted import scripted_app

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.output import MAX_OUTPUT_BYTES
from forgelm_tui.engine.sanitize import MAX_LINE_CHARS
from forgelm_tui.headless.view import MAX_BUFFER_BYTES
from forgelm_tui.tui.model import (
    CHUNK_BYTES,
    LOG_KEEP_MERGED,
    LOG_KEEP_MERGED_BYTES,
    LOG_KEEP_RANKS_BYTES,
    ChunkQueue,
    LogStore,
    RunModel,
)
from forgelm_tui.tui.widgets.log_pane import LOG_PANE_MAX_CHARS, LogPane

RANKS = 2
LONG_LINE_MIB = 300  # per rank, one line, no newline (the 300 MB); the logs keep it all
WIDE_LINES, WIDE_BYTES = 6000, 60_000  # per rank, the case
# Through a real supervisor: 2 x 120 MB of them, 17 times its budget (a memory that grew with the
# data would blow it); the full 2 x 360 MB only costs more time.
CLI_WIDE_LINES = 2000
# The engine per rank (README "Memory"): per stream a 64 KiB read, at most 64 KiB held back, one
# event of at most 128 KiB and its decoded lines, plus the stderr tail: under 1 MiB.
ENGINE_PER_RANK = 1 << 20
SLACK = 4 << 20  # the interpreter: freed memory its allocators keep for reuse
MODEL_BUDGET = LOG_KEEP_MERGED_BYTES + LOG_KEEP_RANKS_BYTES  # the pending queue is within both


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM: the supervisor is gone")


def _supervise(tmp_path: Path, args: list[str], log_bytes: int) -> tuple[int, int]:
    """Run the CLI over ``args`` (a rank script that waits for ``release``); when every rank
    log holds ``log_bytes`` bytes, the supervisor's peak RSS and the bytes it printed."""
    marks = tmp_path / "marks"
    marks.mkdir(parents=True)
    with open(tmp_path / "stdout.txt", "wb") as out:
        run = start(["--nproc-per-node", str(RANKS), *args, str(marks)], tmp_path,
                    stdout=out.fileno())
    try:
        logs = [run.run_dir / f"rank-{r}.stdout.log" for r in range(RANKS)]
        wait_for(lambda: all((marks / f"done-{r}").exists() for r in range(RANKS)), 60,
                 "the ranks to write everything", step=0.05)
        wait_for(lambda: [log.stat().st_size for log in logs] == [log_bytes] * RANKS, 30,
                 "the supervisor to drain every byte into the logs", step=0.05)
        peak = _peak_rss(run.proc.pid)
    finally:
        (marks / "release").write_text("")
    assert run.wait(30) == 0
    return peak, (tmp_path / "stdout.txt").stat().st_size


def _check_log(path: Path, pieces: Iterator[bytes]) -> None:
    """The log holds exactly ``pieces``, read back one by one."""
    with open(path, "rb") as log:
        for i, expected in enumerate(pieces):
            assert log.read(len(expected)) == expected, f"{path.name}: piece {i} differs"
        assert log.read(1) == b"", f"{path.name}: bytes past the end"


def _remove_logs(case: Path) -> None:
    """Gigabytes of rank logs: gone once checked, pass or fail (pytest keeps old tmp dirs)."""
    for log in (case / "run").glob("rank-*.log"):
        log.unlink()


def _within(peak: int, baseline: int, printed: int) -> None:
    # The headless view's buffer holds what it has not yet printed: never more than it printed.
    budget = RANKS * ENGINE_PER_RANK + min(MAX_BUFFER_BYTES, printed) + SLACK
    grew = peak - baseline
    print(f"peak {peak / 2**20:.1f} MiB, baseline {baseline / 2**20:.1f} MiB, "
          f"grew {grew / 2**20:.1f} MiB, budget {budget / 2**20:.1f} MiB")
    assert grew <= budget


@pytest.mark.fault("F14")
@pytest.mark.timeout(90)
def test_a_line_without_end_is_bounded(tmp_path: Path) -> None:
    """2 ranks each write LONG_LINE_MIB MiB without a newline: shown once by its head, kept
    whole in the logs, and the supervisor's memory does not grow with it."""
    baseline, _ = _supervise(tmp_path / "silent", [rank_script("long_line.py"), "0"], 0)
    try:
        peak, printed = _supervise(tmp_path / "long", [rank_script("long_line.py"),
                                                       str(LONG_LINE_MIB)], LONG_LINE_MIB << 20)
        for rank in range(RANKS):
            block = bytes([65 + rank]) * (1 << 20)
            _check_log(tmp_path / "long" / "run" / f"rank-{rank}.stdout.log",
                       (block for _ in range(LONG_LINE_MIB)))
    finally:
        _remove_logs(tmp_path / "long")
    shown = [line for line in (tmp_path / "long" / "stdout.txt").read_text().splitlines()
             if line.startswith("[rank ")]
    assert sorted(shown) == [f"[rank {r}] {chr(65 + r) * (MAX_LINE_CHARS - 1)}…"
                             for r in range(RANKS)]
    _within(peak, baseline, printed)


def _wide_line(rank: int, i: int) -> bytes:
    head = b"r%d %06d " % (rank, i)
    return head + b"x" * (WIDE_BYTES - len(head) - 1) + b"\n"


@pytest.mark.fault("F14")
@pytest.mark.timeout(90)
def test_thousands_of_wide_lines_are_bounded(tmp_path: Path) -> None:
    """2 ranks each write 2000 lines of 60 KB: every byte in the logs, memory flat."""
    script = rank_script("wide_lines.py")
    baseline, _ = _supervise(tmp_path / "silent", [script, "0", str(WIDE_BYTES)], 0)
    try:
        peak, printed = _supervise(tmp_path / "wide", [script, str(CLI_WIDE_LINES),
                                                       str(WIDE_BYTES)],
                                   CLI_WIDE_LINES * WIDE_BYTES)
        for rank in range(RANKS):
            _check_log(tmp_path / "wide" / "run" / f"rank-{rank}.stdout.log",
                       (_wide_line(rank, i) for i in range(CLI_WIDE_LINES)))
    finally:
        _remove_logs(tmp_path / "wide")
    # capped lines, 3 B for "…"
    assert printed < RANKS * CLI_WIDE_LINES * (MAX_LINE_CHARS + 20) * 3
    _within(peak, baseline, printed)


# ---------------------------------------------------------------------- the TUI's stores


def _chunk(rank: int, size: int, lines: int = 1, fill: bytes = b"x") -> ev.RankOutput:
    width = size // lines
    return ev.RankOutput(rank, ev.Stream.STDOUT, b"\n".join([fill * (width - 1)] * lines))


def test_chunk_queue_keeps_at_most_its_bytes_and_drops_the_oldest() -> None:
    queue = ChunkQueue(max_lines=1_000, max_bytes=10 * (1000 + CHUNK_BYTES))
    for i in range(25):
        queue.add(ev.RankOutput(0, ev.Stream.STDOUT, b"%04d" % i + b"x" * 994 + b"\n" + b"y"))
    assert queue.bytes <= queue.max_bytes
    assert len(queue.chunks) == 10 and queue.lines == 20
    assert queue.dropped == 30  # 15 chunks of 2 lines
    assert queue.tail()[0].text.startswith("0015")  # the oldest went first
    queue.add(_chunk(1, 50_000))  # bigger than the whole budget: the newest always stays
    assert [c.rank for c in queue.chunks] == [1]
    queue.clear()
    assert (queue.bytes, queue.lines, queue.dropped) == (0, 0, 0)


def test_chunk_queue_still_keeps_its_line_count() -> None:
    queue = ChunkQueue(max_lines=100, max_bytes=1 << 30)
    for _ in range(50):
        queue.add(_chunk(0, 300, lines=30))
    assert len(queue.tail()) == 100
    assert queue.lines - queue.chunks[0].count < 100


def test_per_rank_histories_share_one_budget() -> None:
    store = LogStore()
    for rank in range(4):
        store.add(_chunk(rank, 100))
    assert {q.max_bytes for q in store.per_rank.values()} == {LOG_KEEP_RANKS_BYTES // 4}


def test_wide_lines_are_kept_as_shown() -> None:
    store = LogStore()
    raw = b"\x1b[31mred\x1b[0m " + b"w" * 60_000 + b"\ntail"
    original = ev.RankOutput(0, ev.Stream.STDERR, raw)
    store.add(ev.RankOutput(0, ev.Stream.STDERR, raw))
    kept = store.merged.chunks[0]
    assert len(kept.raw) <= 4 * MAX_LINE_CHARS and kept.count == 2
    assert [line.text for line in store.history(None)] == list(original.lines)
    assert [line.text for line in store.take_pending()[0]] == list(original.lines)


def test_kept_chunks_hold_no_decoded_text() -> None:
    store = LogStore()
    chunk = _chunk(0, 2000)
    assert chunk.last_line  # decoded (and cached) for the rank table
    store.add(chunk)
    store.history(None)
    store.take_pending()
    kept = vars(store.merged.chunks[0])
    assert "lines" not in kept and "last_line" not in kept


def test_flushes_skip_what_is_past_their_bytes() -> None:
    store = LogStore()
    for _ in range(400):
        store.add(_chunk(0, 7_000, lines=1))  # not compacted: under COMPACT_LINE_BYTES
    lines, skipped = store.take_pending()
    assert lines and len(lines) < 400 and len(lines) + skipped == 400


def _feed(model: RunModel, events: int, size: int, lines: int = 1) -> None:
    for i in range(events):
        for rank in range(RANKS):
            head = b"r%d %06d " % (rank, i)
            width = size // lines
            line = head + b"x" * (width - len(head) - 1)
            model.apply(ev.RankOutput(rank, ev.Stream.STDOUT, b"\n".join([line] * lines)))
        if i % 10 == 0:
            model.logs.take_pending()  # what the app's 10 Hz flush does


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("events", "size", "lines"), [
    (WIDE_LINES, WIDE_BYTES, 1),  # the 60 KB lines, one a chunk
    (300, MAX_OUTPUT_BYTES - 1, 2),  # the biggest chunks the engine sends, 2 lines of 64 KiB
    (15_000, 100, 1),  # a trickle of short lines: the per-chunk cost, bounded by the line counts
    # (2 x 15,000 lines: 1.5 times the merged view's 20,000, 6 times a rank's 5,000)
    (300, 65_536, 650),  # a flood of full read chunks
])
def test_the_tui_model_keeps_within_its_budget(events: int, size: int, lines: int) -> None:
    """RunModel.apply over 2 ranks of RankOutput events: what it retains, measured by
    tracemalloc, stays within the log store's byte budget."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        model = RunModel("run", ["x"], RANKS, clock=lambda: 0.0)
        _feed(model, events, size, lines)
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    held = model.logs.held_bytes
    print(f"retained {retained / 2**20:.1f} MiB, held {held / 2**20:.1f} MiB, "
          f"merged {model.logs.merged.lines} lines")
    assert held <= MODEL_BUDGET
    assert retained <= MODEL_BUDGET
    assert model.logs.merged.lines <= LOG_KEEP_MERGED + lines
    assert model.logs.total == events * RANKS * lines


@pytest.mark.timeout(60)
async def test_the_log_pane_keeps_its_characters_and_renders_wide_lines_in_part() -> None:
    app, run, prepare = scripted_app("running")
    async with app.run_test(size=(120, 40)) as pilot:
        await prepare(pilot)
        for i in range(3_000):
            run.emit(_chunk(i % RANKS, 60_000, fill=b"%d" % (i % 10)))
            if i % 50 == 0:
                app.flush_logs()
        app.flush_logs()
        await pilot.pause()
        pane = app.query_one(LogPane)
        chars = sum(map(len, pane.lines))
        assert LOG_PANE_MAX_CHARS - 2 * MAX_LINE_CHARS < chars <= LOG_PANE_MAX_CHARS
        last = pane.lines[-1]
        assert last == "[rank 1] " + "9" * (MAX_LINE_CHARS - 1) + "…"
        bottom = pane.scrollable_content_region.height - 1
        for x in (0, 700, len(last)):  # rendered in part, as a whole one would show
            pane.scroll_to(x=x, animate=False, immediate=True)
            await pilot.pause()
            shown = pane.scroll_offset.x
            expected = last[shown : shown + pane.size.width]
            assert pane.render_line(bottom).text.rstrip() == expected, x
        assert shown > 0 and expected.endswith("…")
