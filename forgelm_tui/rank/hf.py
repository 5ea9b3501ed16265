"""Stop together inside a Hugging Face ``transformers.Trainer`` loop.

    from forgelm_tui.rank.hf import StopTogetherCallback

    trainer = Trainer(model, args, train_dataset=data, callbacks=[StopTogetherCallback()])
    trainer.train()

A SIGTERM or SIGINT reaching any one rank (a scheduler, an operator, the supervisor) is only
recorded by the handler; at the end of the next optimizer step every rank agrees in one
all-reduce (:class:`~forgelm_tui.rank.stop.StopAgreement`) and, on agreement, asks the Trainer
to save a checkpoint and stop: every rank leaves the loop at the same global step and
``train()`` returns normally (nothing collective ever runs inside a signal handler, so no rank
is left blocked in a gradient all-reduce its peers will never join). Each step is also reported
to forgelm-tui (step, max steps, latest logged loss; again when the Trainer logs the step's own
loss); outside forgelm-tui that is a no-op.

This is the only module of ``forgelm_tui`` that imports ``transformers``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from forgelm_tui.rank.channel import report_progress
from forgelm_tui.rank.stop import AgreementHolder

__all__ = ["StopTogetherCallback", "latest_loss"]


class StopTogetherCallback(AgreementHolder, TrainerCallback):
    """Every rank stops at the same step, after a checkpoint, once any rank is signalled.

    ``every``: agree only every k-th optimizer step (one all-reduce of one integer each time;
    raise it when steps are very short). ``signals``: what asks for a stop (default SIGTERM,
    SIGINT). ``save``: ask the Trainer to save a checkpoint at the agreed step (default True).
    ``report``: send per-step progress to forgelm-tui (default True).

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
    ) -> None:
        AgreementHolder.__init__(self, signals, every)
        self.save = save
        self.report = report

    # ------------------------------------------------------------- Trainer hooks

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self.restore_signals()
        self.take_over_signals()  # a fresh agreement per train()

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> TrainerControl:
        step = int(state.global_step)
        if self.report:
            loss = latest_loss(state.log_history)
            report_progress(step, int(state.max_steps) or None,
                            {"loss": loss} if loss is not None else None)
        # Every rank reaches on_step_end once per optimizer step: the same point on all ranks.
        if self.stop.should_stop(step):
            if self.save:
                control.should_save = True
            control.should_training_stop = True
        return control

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # The Trainer logs a step's loss after on_step_end: report it as soon as it exists.
        loss = (logs or {}).get("loss")
        if self.report and isinstance(loss, int | float) and not isinstance(loss, bool):
            report_progress(int(state.global_step), int(state.max_steps) or None,
                            {"loss": float(loss)})

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self.restore_signals()


def latest_loss(log_history: Sequence[Mapping[str, Any]]) -> float | None:
    """The most recent training loss in a Trainer's ``state.log_history``, if any."""
    for entry in reversed(log_history):  # the newest entries first: no copy of a long history
        value = entry.get("loss")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None
