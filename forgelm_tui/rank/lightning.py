"""Stop together inside a Lightning (``lightning.pytorch``) training loop.

    from forgelm_tui.rank.lightning import StopTogetherCallback

    stop = StopTogetherCallback(checkpoint_path="ckpt/stopped-{step}.ckpt")
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", callbacks=[stop])
    trainer.fit(model, data)

Lightning 2.6 installs its own SIGTERM handler (its signal connector) when ``fit`` starts. That
handler runs a ``broadcast`` *inside the handler*: when the signal reaches one rank only, that
broadcast pairs with a peer's gradient all-reduce and both ranks block forever; and a rank
stopped that way raises ``SIGTERMException`` (a ``SystemExit``) and exits 0.

This callback takes the SIGTERM/SIGINT handlers over from Lightning as soon as training starts
(``on_sanity_check_start`` / ``on_train_start``, the first hooks after Lightning registers its
own); Lightning's handler is not called, so Lightning never sets ``received_sigterm`` and never
raises on one rank alone. Our handler only records the signal. At the end of every training
batch each rank calls :meth:`StopAgreement.should_stop` (one all-reduce of one integer, the same
point on every rank); on agreement every rank saves a checkpoint (when a path is configured or
a ``ModelCheckpoint`` is present) and sets ``trainer.should_stop``: ``fit`` returns on every rank
after the same global step. Lightning's handlers are put back at ``on_train_end`` /
``on_exception``, before Lightning restores the original ones in its own teardown.

Remaining window: a signal that arrives between Lightning's registration and the first hook above
(the "run-stage" barrier) still reaches Lightning's own handler.

Progress (:class:`ProgressReportCallback`, which ``StopTogetherCallback`` includes): each
training batch's global step is reported to forgelm-tui, and validation batches (throttled) and
checkpoint saves send heartbeats from the main thread, so a long validation between two steps is
not taken for a stall (docs/progress.md). Outside forgelm-tui all of it is a no-op.

This is the only module of ``forgelm_tui`` that imports ``lightning``.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from forgelm_tui.rank.channel import Channel, Heartbeats, default_channel
from forgelm_tui.rank.stop import AgreementHolder

__all__ = ["ProgressReportCallback", "StopTogetherCallback"]


class ProgressReportCallback(pl.Callback):  # type: ignore[misc]  # Lightning is Any to mypy
    """Reports each training batch's global step and sends heartbeats during validation and at
    checkpoint saves; handles no signal. ``report``: send per-step progress (default True).
    ``heartbeat_every``: the most frequent heartbeat during validation, in seconds."""

    def __init__(self, *, report: bool = True, heartbeat_every: float = 1.0,
                 channel: Channel | None = None) -> None:
        self.report = report
        self.channel = channel
        self.beats = Heartbeats(channel, heartbeat_every)
        self._total: int | None = None

    def _progress(self, trainer: pl.Trainer, loss: float | None) -> None:
        if self.report:
            (self.channel or default_channel()).progress(
                int(trainer.global_step), self._total,
                {"loss": loss} if loss is not None else None)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._total = _total_steps(trainer)
        self._progress(trainer, None)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._progress(trainer, _loss(outputs))

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self.beats.beat()  # every validation batch: throttled

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.beats.beat(force=True)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self.beats.beat(force=True)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.beats.beat(force=True)


class StopTogetherCallback(AgreementHolder, ProgressReportCallback):
    """Every rank stops at the same global step, after a checkpoint, once any rank is signalled.

    ``checkpoint_path``: where to save at the agreed stop; ``{step}`` is replaced by the global
    step. Without it, a ``stopped-step=<step>.ckpt`` goes into the first ``ModelCheckpoint``'s
    directory when the trainer has one, and nothing is saved otherwise. ``every``: agree only on
    every k-th batch. ``signals``: what asks for a stop (default SIGTERM, SIGINT). ``report``:
    send per-step progress to forgelm-tui (default True; a no-op outside forgelm-tui).
    """

    def __init__(
        self,
        *,
        checkpoint_path: str | os.PathLike[str] | None = None,
        every: int = 1,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        report: bool = True,
        channel: Channel | None = None,
    ) -> None:
        self.checkpoint_path = os.fspath(checkpoint_path) if checkpoint_path is not None else None
        AgreementHolder.__init__(self, signals, every)
        ProgressReportCallback.__init__(self, report=report, channel=channel)
        self.checkpoint: str | None = None  # what was saved at the agreed stop

    # ------------------------------------------------------------- Lightning hooks

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_over_signals()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_over_signals()
        self.checkpoint = None
        super().on_train_start(trainer, pl_module)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step = int(trainer.global_step)
        # Every rank runs the same number of batches: this is the same point on all ranks.
        if self.stop.should_stop(step):
            self.checkpoint = self._save(trainer, step)
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.restore_signals()
        super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self.restore_signals()

    # ------------------------------------------------------------- checkpoint

    def _save(self, trainer: pl.Trainer, step: int) -> str | None:
        """Every rank calls this at the agreed step (Lightning writes on rank 0, then barriers)."""
        path = self._checkpoint_file(trainer, step)
        if path is not None:
            trainer.save_checkpoint(path, weights_only=False)
        return path

    def _checkpoint_file(self, trainer: pl.Trainer, step: int) -> str | None:
        if self.checkpoint_path is not None:
            return self.checkpoint_path.replace("{step}", str(step))
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath:
                name = f"stopped-step={step}{callback.FILE_EXTENSION}"
                return os.path.join(os.fspath(callback.dirpath), name)
        return None


def _total_steps(trainer: pl.Trainer) -> int | None:
    if trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        estimated = trainer.estimated_stepping_batches
    except Exception:  # no dataloader length (iterable datasets): the total is unknown
        return None
    return int(estimated) if math.isfinite(estimated) else None


def _loss(outputs: Any) -> float | None:
    """The loss ``training_step`` returned (a tensor, or a mapping with a ``loss`` tensor)."""
    value: Any = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if not hasattr(value, "item"):
        return None
    try:
        return float(value.item())
    except (RuntimeError, ValueError):  # not a one-element tensor
        return None
