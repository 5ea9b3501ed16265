"""Stop together inside a Hugging Face ``transformers.Trainer`` loop, and report progress.

    from forgelm_tui.rank.hf import StopTogetherCallback

    trainer = Trainer(model, args, train_dataset=data, callbacks=[StopTogetherCallback()])
    trainer.train()

A SIGTERM or SIGINT reaching any one rank (a scheduler, an operator, the supervisor) is only
recorded by the handler; at the end of the next optimizer step every rank agrees in one
all-reduce (:class:`~forgelm_tui.rank.stop.StopAgreement`) and, on agreement, asks the Trainer
to save a checkpoint and stop: every rank leaves the loop at the same global step and
``train()`` returns normally (nothing collective ever runs inside a signal handler, so no rank
is left blocked in a gradient all-reduce its peers will never join).

Progress (:class:`ProgressReportCallback`, which ``StopTogetherCallback`` includes): each step is
reported to forgelm-tui (step, max steps, latest logged loss; again when the Trainer logs the
step's own loss), and the Trainer's evaluation, prediction and checkpoint saves send heartbeats
from the main thread, so a long evaluation between two steps is not taken for a stall
(docs/progress.md). Outside forgelm-tui all of it is a no-op. The graceful runner adds a
``ProgressReportCallback`` to every Trainer of the program it runs (``trainer_hook``).

This is the only module of ``forgelm_tui`` that imports ``transformers``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from forgelm_tui.rank.channel import Channel, Heartbeats, default_channel
from forgelm_tui.rank.stop import AgreementHolder

__all__ = ["ProgressReportCallback", "StopTogetherCallback", "latest_loss"]


class ProgressReportCallback(TrainerCallback):  # type: ignore[misc]  # transformers is Any to mypy
    """Reports steps and sends heartbeats at evaluation and save; handles no signal.

    ``report``: send per-step progress (default True). ``heartbeat_every``: the most frequent
    heartbeat during an evaluation or prediction loop, in seconds. ``channel``: where to send
    (default: the one forgelm-tui names in the environment).
    """

    def __init__(self, *, report: bool = True, heartbeat_every: float = 1.0,
                 channel: Channel | None = None) -> None:
        self.report = report
        self.channel = channel
        self.beats = Heartbeats(channel, heartbeat_every)

    def _progress(self, state: TrainerState, loss: float | None) -> None:
        if self.report:
            (self.channel or default_channel()).progress(
                int(state.global_step), int(state.max_steps) or None,
                {"loss": loss} if loss is not None else None)

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        # Before any evaluation bar: this rank reports through the channel (its bars are not
        # read for steps; a baseline evaluation's bar is never taken for the training step).
        self.beats.beat(force=True)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self._progress(state, latest_loss(state.log_history))

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> TrainerControl:
        self._progress(state, latest_loss(state.log_history))
        return control

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # The Trainer logs a step's loss after on_step_end: report it as soon as it exists.
        loss = (logs or {}).get("loss")
        if isinstance(loss, int | float) and not isinstance(loss, bool):
            self._progress(state, float(loss))

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState,
                           control: TrainerControl, **kwargs: Any) -> None:
        self.beats.beat()  # every evaluation batch: throttled

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self.beats.beat(force=True)

    def on_predict(self, args: TrainingArguments, state: TrainerState,
                   control: TrainerControl, metrics: Any = None, **kwargs: Any) -> None:
        self.beats.beat(force=True)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self.beats.beat(force=True)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self.beats.beat(force=True)


class StopTogetherCallback(AgreementHolder, ProgressReportCallback):
    """Every rank stops at the same step, after a checkpoint, once any rank is signalled.

    ``every``: agree only every k-th optimizer step (one all-reduce of one integer each time;
    raise it when steps are very short). ``signals``: what asks for a stop (default SIGTERM,
    SIGINT). ``save``: ask the Trainer to save a checkpoint at the agreed step (default True).
    ``report``: send per-step progress to forgelm-tui (default True); heartbeats at evaluation
    and save are always sent (:class:`ProgressReportCallback`).

    Handlers are installed at ``on_train_begin`` and restored at ``on_train_end``. The Trainer
    has no hook for an exception leaving ``train()``: a program that survives one and goes on
    should call :meth:`restore_signals` itself.
    """

    def __init__(
        self,
        *,
        every: int = 1,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        save: bool = True,
        report: bool = True,
        channel: Channel | None = None,
    ) -> None:
        AgreementHolder.__init__(self, signals, every)
        ProgressReportCallback.__init__(self, report=report, channel=channel)
        self.save = save

    # ------------------------------------------------------------- Trainer hooks

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self.restore_signals()
        self.take_over_signals()  # a fresh agreement per train()
        super().on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> TrainerControl:
        super().on_step_end(args, state, control, **kwargs)
        # Every rank reaches on_step_end once per optimizer step: the same point on all ranks.
        if self.stop.should_stop(int(state.global_step)):
            if self.save:
                control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self.restore_signals()
        super().on_train_end(args, state, control, **kwargs)


def latest_loss(log_history: Sequence[Mapping[str, Any]]) -> float | None:
    """The most recent training loss in a Trainer's ``state.log_history``, if any."""
    for entry in reversed(log_history):  # the newest entries first: no copy of a long history
        value = entry.get("loss")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None
