"""Real HF and Lightning Trainers training a tiny random model in this process (single process,
CPU, nothing downloaded): every test of the suite that does, in one module, so that one xdist
worker pays the libraries' import (~7 s of CPU: Lightning imports transformers too, through
torchmetrics) rather than three (`--dist loadfile`: a module's tests run on one worker).

- The rank helpers' callbacks say "still alive" while a Trainer evaluates and saves (a recording
  channel notes every message and the hook that sent it), and the graceful runner gives every HF
  Trainer that callback (ForgeLM unchanged).
- The stop-together callbacks without a process group (HF, Lightning) stop at the signalled step
  and put the SIGTERM handler back; their 2-rank runs under forgelm-tui are test_rank_adapters.py
  and test_lightning.py.
- A Lightning training step that raises is a crash, down to the stderr forgelm-tui reads.
"""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from forgelm_tui.channel import CHANNEL_ENV, MessageKind
from forgelm_tui.rank.channel import Channel, Heartbeats

pytestmark = pytest.mark.timeout(120)


class Recorder(Channel):
    """A channel that keeps what it is asked to send: (kind, hook, step)."""

    def __init__(self) -> None:
        super().__init__(address="")
        self.sent: list[tuple[MessageKind, str | None, int | None]] = []

    def send(self, kind: MessageKind, **fields: Any) -> None:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and not frame.f_code.co_name.startswith("on_"):
            frame = frame.f_back
        self.sent.append((kind, frame.f_code.co_name if frame else None, fields.get("step")))

    def beats(self) -> list[str | None]:
        return [hook for kind, hook, _ in self.sent if kind is MessageKind.HEARTBEAT]

    def steps(self) -> list[int | None]:
        return [step for kind, _, step in self.sent if kind is MessageKind.PROGRESS]

    def index(self, kind: MessageKind, hook: str, after: int = 0) -> int:
        return next(i for i, (k, h, _) in enumerate(self.sent) if i >= after and k is kind
                    and h == hook)


def test_heartbeats_from_hooks_that_run_often_are_throttled() -> None:
    recorder = Recorder()
    beats = Heartbeats(recorder, every=60.0)
    beats.beat()
    beats.beat()
    beats.beat(force=True)
    assert len(recorder.sent) == 2


def _tokens(count: int) -> Any:
    import torch

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.ids = torch.randint(0, 32, (count, 8), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return count

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    return Tokens()


def test_hf_callback_reports_steps_and_beats_at_evaluation_and_save(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from forgelm_tui.rank.hf import ProgressReportCallback, StopTogetherCallback

    recorder = Recorder()
    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
        per_device_eval_batch_size=2, eval_strategy="steps", eval_steps=2, save_strategy="steps",
        save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=1)
    callback = ProgressReportCallback(channel=recorder, heartbeat_every=0.0)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=_tokens(16),
                      eval_dataset=_tokens(6), callbacks=[callback])
    trainer.train()
    assert recorder.steps()[:1] == [0] and max(s or 0 for s in recorder.steps()) == 4
    beats = recorder.beats()
    assert beats[0] == "on_init_end"  # before any evaluation: this rank reports on the channel
    assert {"on_prediction_step", "on_evaluate", "on_save", "on_train_end"} <= set(beats)
    assert beats.count("on_prediction_step") == 2 * 3  # two evaluations of three batches
    # The evaluation and the save after step 2 come before step 3 is reported.
    after_2 = recorder.steps().index(2)
    step_3 = next(i for i, (k, _, s) in enumerate(recorder.sent)
                  if k is MessageKind.PROGRESS and s == 3)
    between = {h for k, h, _ in recorder.sent[after_2:step_3] if k is MessageKind.HEARTBEAT}
    assert {"on_evaluate", "on_save"} <= between, recorder.sent
    assert isinstance(StopTogetherCallback(), ProgressReportCallback)


def test_lightning_callback_beats_at_validation_and_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from forgelm_tui.rank.lightning import ProgressReportCallback, StopTogetherCallback

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, index: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4, generator=generator),
                                          torch.randn(40, 1, generator=generator))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    recorder = Recorder()
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(max_steps=4, val_check_interval=2, limit_val_batches=3,
                         num_sanity_val_steps=0, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[checkpoints,
                                    ProgressReportCallback(channel=recorder, heartbeat_every=0.0)])
    trainer.fit(Model(), loader, loader)
    assert recorder.steps()[0] == 0 and recorder.steps()[-1] == 4
    beats = recorder.beats()
    assert beats.count("on_validation_batch_end") == 2 * 3  # two validations of three batches
    assert {"on_validation_end", "on_save_checkpoint", "on_train_end"} <= set(beats)
    step_2 = recorder.steps().index(2)
    assert recorder.index(MessageKind.HEARTBEAT, "on_validation_end", step_2) < next(
        i for i, (k, _, s) in enumerate(recorder.sent) if k is MessageKind.PROGRESS and s == 3)
    assert isinstance(StopTogetherCallback(), ProgressReportCallback)


@pytest.mark.parametrize("channel", [True, False])
def test_the_graceful_runner_gives_every_trainer_the_callback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, channel: bool) -> None:
    """Only under forgelm-tui (a channel named), only once the program imports the Trainer's
    module: the hook the graceful runner installs before it runs the program (``trainer_hook``)
    imports nothing itself, and the module's source stays readable (inspect, tracebacks).

    In this process, on a stand-in for ``transformers.trainer`` found by the same import
    machinery; transformers' own Trainer gets the callback in the real ForgeLM run
    (test_forgelm_real.py::test_two_ranks_of_forgelm_awaiting_approval_show_every_training_step:
    every rank's steps come from the channel)."""
    pytest.importorskip("transformers")
    from forgelm_tui.rank import trainer_hook
    from forgelm_tui.rank.hf import ProgressReportCallback

    name = "stand_in_trainer"
    (tmp_path / f"{name}.py").write_text("DEFAULT_CALLBACKS = []\n\n\n"
                                         "def train():\n    return 'trained'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(trainer_hook, "TRAINER_MODULE", name)
    if channel:
        monkeypatch.setenv(CHANNEL_ENV, "@forgelm-tui-test-nobody-listens")
    else:
        monkeypatch.delenv(CHANNEL_ENV, raising=False)
    meta_path = list(sys.meta_path)
    try:
        assert trainer_hook.install() is channel
        assert name not in sys.modules  # the program keeps its own import order
        module = importlib.import_module(name)
        callbacks = module.DEFAULT_CALLBACKS
        assert callbacks == ([ProgressReportCallback] if channel else [])
        assert "return 'trained'" in inspect.getsource(module.train)
        assert sys.meta_path == meta_path  # the hook's finder is gone once it has done its job
    finally:
        sys.meta_path[:] = meta_path
        sys.modules.pop(name, None)


def test_latest_loss_reads_the_newest_logged_loss() -> None:
    from forgelm_tui.rank.hf import latest_loss  # the module imports transformers

    history = [{"loss": 3.0, "step": 1}, {"loss": 2.5, "step": 2}, {"eval_loss": 9.0, "step": 2}]
    assert latest_loss(history) == 2.5
    assert latest_loss([]) is None
    assert latest_loss([{"train_loss": 1.0}]) is None


def test_single_process_without_a_process_group(tmp_path: Path) -> None:
    """In this process, no torch.distributed group: the callback still stops (and saves) at the
    signalled step, and puts the SIGTERM handler back."""
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from forgelm_tui.rank.hf import StopTogetherCallback

    stop = StopTogetherCallback()

    class SigtermAtStep3(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 3:
                # Only ever to the callback's handler: never to this process's own.
                assert signal.getsignal(signal.SIGTERM) == stop.stop._on_signal
                os.kill(os.getpid(), signal.SIGTERM)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        ids = torch.randint(0, 32, (40, 8), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=20, per_device_train_batch_size=2,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    before = signal.getsignal(signal.SIGTERM)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
                      callbacks=[SigtermAtStep3(), stop])
    trainer.train()
    assert trainer.state.global_step == 3 and stop.stopped_at_step == 3
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-3"]
    assert signal.getsignal(signal.SIGTERM) == before


def _fit_in_process(callbacks: list[Any], raise_at_step: int | None = None) -> Any:
    """A tiny single-device Lightning ``fit`` in this process (CPU); returns the Trainer."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_step == raise_at_step:
                raise RuntimeError("rank 0: simulated crash in training_step")
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(80, 8, generator=generator),
                         torch.randn(80, 1, generator=generator))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=40, max_epochs=1, logger=False,
                         callbacks=callbacks, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Tiny(), DataLoader(data, batch_size=2))
    return trainer


def test_callback_single_process_saves_into_the_model_checkpoint_dir(tmp_path: Path) -> None:
    """In this process: no process group, no checkpoint path. A SIGTERM at step 3 stops ``fit``
    there; the stop checkpoint goes to ModelCheckpoint's dir; the handlers are put back."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from forgelm_tui.rank.lightning import StopTogetherCallback

    stop = StopTogetherCallback()

    class SigtermAtStep3(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 3:
                # Only ever to the callback's handler: never to this process's own.
                assert signal.getsignal(signal.SIGTERM) == stop.stop._on_signal
                os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    trainer = _fit_in_process([SigtermAtStep3(), ModelCheckpoint(dirpath=tmp_path / "ckpts"),
                               stop])
    checkpoint = tmp_path / "ckpts" / "stopped-step=3.ckpt"
    assert (trainer.global_step, stop.stopped, stop.stopped_at_step) == (3, True, 3)
    assert stop.checkpoint == str(checkpoint) and trainer.interrupted is False
    assert signal.getsignal(signal.SIGTERM) == before
    assert checkpoint.exists()


def test_a_lightning_rank_that_raises_is_a_crash(capfd: pytest.CaptureFixture[str]) -> None:
    """Lightning re-raises a training step's exception out of ``fit`` (the same exception, no
    ``SystemExit``), after writing what it writes: the rank dies of it with the traceback as its
    last words, exit 1, which forgelm-tui (engine/crash.py) names as a crash, 2.

    Here in this process, down to the stderr forgelm-tui reads. A real rank doing that under
    forgelm-tui, its peer stopped: test_crash_and_teardown.py (F01); a peer blocked in a gloo
    collective: test_exit_codes.py (F07)."""
    import traceback

    from forgelm_tui.engine.crash import from_stderr

    with pytest.raises(RuntimeError) as raised:
        _fit_in_process([], raise_at_step=3)
    written = capfd.readouterr().err  # what Lightning wrote while it handled the exception
    stderr = written + "".join(traceback.format_exception(raised.value))
    assert from_stderr(stderr) == ("RuntimeError", "rank 0: simulated crash in training_step")
