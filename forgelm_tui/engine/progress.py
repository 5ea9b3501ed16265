"""Progress: how far each rank is and whether it said it was stopped, from two sources.

The channel (``forgelm_tui.rank`` helpers send messages, see ``forgelm_tui.channel``) and, for
programs that do not use it, recognised training progress bars in the rank's output (HF
Trainer's and Lightning's tqdm bars, HF's log dicts; ``progress_lines``), and Lightning's
``Received SIGTERM``. What each sign of life proves is decided by ``RankRecord.saw``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from itertools import islice

from forgelm_tui.channel import Message, MessageKind
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.channel import ChannelServer
from forgelm_tui.engine.events import ProgressSource
from forgelm_tui.engine.progress_lines import (
    LIGHTNING_SIGTERM,
    Bar,
    lines_with,
    parse_bar,
    parse_loss,
    raw_lines_with,
)
from forgelm_tui.engine.records import Evidence, RankRecord, StacksHandler

MAX_BAR_LINES = 64  # bar lines read per chunk, newest first (tqdm redraws in place: few)


class ProgressReader:
    def __init__(self, emit: Callable[[ev.Event], None]) -> None:
        self._emit = emit

    def read_output(self, record: RankRecord, raw: bytes) -> None:
        """Progress and stop notices from newline-joined output lines (or a bar's redraws)."""
        if LIGHTNING_SIGTERM in raw:  # C-speed scans of the chunk before any per-line work
            self.reported_stop(record, "SIGTERM", None)
        # A rank that talks on the channel reports its own steps: its bars are not read.
        if record.channel_seen or not (b"loss" in raw or b"/" in raw):
            return
        now = time.monotonic()
        step = self._bars(record, raw, now)
        loss = next((v for v in map(parse_loss, lines_with(raw, b"loss")) if v is not None),
                    None)
        moved = step is not None and step != (record.step, record.total)
        if not moved and (loss is None or record.metrics == {"loss": loss}):
            return  # a bar redrawn at the same step: nothing new to tell
        if step is not None and moved:
            record.saw(Evidence.STEP, now)
            record.step, record.total = step
        if loss is not None:
            record.metrics = {"loss": loss}
            record.history.add(record.step, record.metrics)  # only values just reported
        self._progressed(record, ProgressSource.OUTPUT)

    @staticmethod
    def _bars(record: RankRecord, raw: bytes, now: float) -> tuple[int, int] | None:
        """The training bar's (step, total): of the chunk's newest bars (it may hold an
        evaluation after the training bar), the newest with the largest total. Any other loop
        bar that moved on since the last one seen is a sign of life, never the step."""
        training: Bar | None = None
        other: Bar | None = None
        lines = raw_lines_with(raw, b"/", b"[", b"|")
        for found in filter(None, map(parse_bar, islice(lines, MAX_BAR_LINES))):
            bar: Bar | None = found
            if found.is_training(max(record.total or 0, training.total if training else 0)):
                if training is not None and found.total <= training.total:
                    continue  # an older redraw of the training bar
                bar, training = training, found  # a bar it displaces was another loop
            if bar is not None and other is None:
                other = bar
        if other is not None and (other.label, other.total, other.step) != record.loop_bar:
            record.loop_bar = (other.label, other.total, other.step)
            record.saw(Evidence.HEARTBEAT, now)
        return None if training is None else (training.step, training.total)

    def read_message(self, record: RankRecord, message: Message) -> None:
        if message.kind is MessageKind.STACKS_HANDLER:
            self._stacks_handler(record, message)
            return  # no progress, no heartbeat: a runtime's announcement (its bars still count)
        if message.kind is MessageKind.COLLECTIVES:
            self._collectives(record, message)
            return  # a background thread's report: only completed collectives count
        now = time.monotonic()
        record.channel_seen = True
        match message.kind:
            case MessageKind.PROGRESS:
                if message.step is not None and message.step != record.step:
                    record.saw(Evidence.STEP, now)  # only a step that moved on is progress
                record.step = message.step if message.step is not None else record.step
                record.total = message.total if message.total is not None else record.total
                if message.metrics:
                    record.metrics = dict(message.metrics)
                    record.history.add(record.step, record.metrics)
                self._progressed(record, ProgressSource.CHANNEL)
            case MessageKind.STOP_REQUESTED:
                record.saw(Evidence.HEARTBEAT, now)
                self.reported_stop(record, message.signal or "SIGTERM", None)
            case MessageKind.STOPPED:
                record.saw(Evidence.HEARTBEAT, now)
                record.stopped_step = message.step
                if message.step is not None:
                    record.step = message.step
                self._emit(ev.RankReportedStop(record.rank, record.reported_signal,
                                               record.foreign_stop, record.stopped_step))
            case MessageKind.HEARTBEAT | MessageKind.OTHER:
                record.saw(Evidence.HEARTBEAT, now)  # the main thread said it is alive

    @staticmethod
    def _collectives(record: RankRecord, message: Message) -> None:
        """A group's count that moved is progress: the rank entered a new collective, so its
        last one completed, and every rank of the group took part. Once a stall is declared
        the counts stay as they were: the hang is named from them (engine/hang.py)."""
        if record.stalled:
            return
        if not message.groups:  # it destroyed its groups (rank/collectives.py): it is ending
            record.collectives_over = bool(record.collectives)
            return
        before = record.collectives
        record.collectives = dict(message.groups)
        if any(count > before.get(pg, 0) for pg, count in message.groups.items()):
            record.saw(Evidence.COLLECTIVE, time.monotonic())

    @staticmethod
    def _stacks_handler(record: RankRecord, message: Message) -> None:
        """Only the rank's own process counts (a child with the same RANK is not signalled)."""
        if message.pid == record.pid and message.signum is not None and message.file:
            record.stacks_handler = StacksHandler(message.signum, message.thread, message.file)

    def reported_stop(self, record: RankRecord, signal_name: str, step: int | None) -> None:
        """A rank received a stop signal; foreign unless the supervisor had sent one."""
        if record.reported_signal is not None:
            return
        record.reported_signal = signal_name
        record.reported_mono = time.monotonic()
        record.foreign_stop = not record.signalled_first
        self._emit(ev.RankReportedStop(record.rank, signal_name, record.foreign_stop, step))

    def _progressed(self, record: RankRecord, source: ProgressSource) -> None:
        record.progress_source = source
        self._emit(ev.RankProgressed(record.rank, record.step, record.total,
                                     dict(record.metrics), source))


def open_channel(loop: asyncio.AbstractEventLoop, run_id: str,
                 records: Mapping[int, RankRecord],
                 emit: Callable[[ev.Event], None]) -> ChannelServer | None:
    """The ranks' progress channel (docs/channel.md), read into their records; None when it
    cannot be opened: progress is optional, the run goes on without it."""
    try:
        channel = ChannelServer(run_id)
    except OSError:
        return None
    reader = ProgressReader(emit)

    def on_message(message: Message) -> None:
        record = records.get(message.rank)
        if record is not None and record.pid is not None:
            reader.read_message(record, message)

    channel.start(loop, on_message)
    return channel
