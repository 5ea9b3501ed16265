"""Progress: how far each rank is and whether it said it was stopped, from two sources.

The channel (``forgelm_tui.rank`` helpers send messages, see ``forgelm_tui.channel``) and, for
programs that do not use it, recognised progress lines in the rank's output (HF Trainer's bar
and log dicts, Lightning's ``Received SIGTERM``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from forgelm_tui.channel import Message, MessageKind
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import ProgressSource
from forgelm_tui.engine.progress_lines import LIGHTNING_SIGTERM, lines_with, parse_loss, parse_step
from forgelm_tui.engine.records import RankRecord


class ProgressReader:
    def __init__(self, emit: Callable[[ev.Event], None]) -> None:
        self._emit = emit

    def read_output(self, record: RankRecord, raw: bytes) -> None:
        """Progress and stop notices from newline-joined output lines."""
        if LIGHTNING_SIGTERM in raw:  # C-speed scans of the chunk before any per-line work
            self.reported_stop(record, "SIGTERM", None)
        if record.progress_source is ProgressSource.CHANNEL or not (b"loss" in raw or b"/" in raw):
            return
        step = next(filter(None, map(parse_step, lines_with(raw, b"/", b"[", b"|"))), None)
        loss = next((v for v in map(parse_loss, lines_with(raw, b"loss")) if v is not None),
                    None)
        if step is None and loss is None:
            return
        if step is not None:
            record.step, record.total = step
        if loss is not None:
            record.metrics = {"loss": loss}
        self._progressed(record, ProgressSource.OUTPUT)

    def read_message(self, record: RankRecord, message: Message) -> None:
        record.last_progress_mono = time.monotonic()  # any message is a heartbeat
        match message.kind:
            case MessageKind.PROGRESS:
                record.step = message.step if message.step is not None else record.step
                record.total = message.total if message.total is not None else record.total
                if message.metrics:
                    record.metrics = dict(message.metrics)
                self._progressed(record, ProgressSource.CHANNEL)
            case MessageKind.STOP_REQUESTED:
                self.reported_stop(record, message.signal or "SIGTERM", None)
            case MessageKind.STOPPED:
                record.stopped_step = message.step
                if message.step is not None:
                    record.step = message.step
                self._emit(ev.RankReportedStop(record.rank, record.reported_signal,
                                               record.foreign_stop, record.stopped_step))
            case MessageKind.HEARTBEAT | MessageKind.OTHER:
                pass

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
