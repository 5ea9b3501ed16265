"""Lightning DDP ranks (CPU, gloo) under forgelm-tui, signalled from outside the supervisor.

forgelm-tui gives each rank torchrun's environment, so Lightning (``strategy="ddp"``,
``devices=2``) detects torchelastic and does not spawn processes of its own
(tests/ranks/lightning_job.py). Plain Lightning 2.6 stops a SIGTERMed rank by raising
``SIGTERMException`` (a ``SystemExit``): the rank exits 0 and logs ``Received SIGTERM``;
forgelm-tui reads that line and reports the run as interrupted, exit 2 (rule 4), naming the rank
signalled first. With ``forgelm_tui.rank.lightning.StopTogetherCallback`` a SIGTERM to one rank
only stops every rank at the same step, after a checkpoint (plain Lightning deadlocks there: its
handler broadcasts inside the handler, against the peer's gradient all-reduce).

Single-process Lightning (the callback without a process group; a training step that raises)
trains in this process.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest
from conftest import Run, rank_script, ready_pids, start, wait_for
from stop_checks import assert_interrupted_from_outside, assert_stopped_together

# Not imported here: collecting this file costs no import of lightning (seconds of CPU in
# every xdist worker); the ranks import it, and the one test that trains in this process.
pytestmark = [pytest.mark.timeout(75), pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="needs lightning")]
DEADLINE = 60  # from launch to the supervisor's exit, on a loaded 2-core machine
PAUSE_STEP = 3


class Lines:
    """The supervisor's stdout, read as it comes (the view's rank-prefixed lines)."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self) -> str:
        self._thread.join(10)
        return "\n".join(self.lines)


def _launch(tmp_path: Path, marks: Path, *extra: str) -> tuple[Run, Lines]:
    run = start(["--nproc-per-node", "2", "--grace", "20", rank_script("lightning_job.py"),
                 str(marks), *extra], tmp_path)
    return run, Lines(run.proc.stdout)


def _signal_in_order(run: Run, lines: Lines, marks: Path, first: int) -> None:
    """Both ranks paused at PAUSE_STEP: SIGTERM ``first``, see it taken, then the other, then go.
    """
    pids = ready_pids(marks, 2)
    for rank in (0, 1):
        wait_for(lambda r=rank: lines.has(f"[rank {r}] rank {r}: paused"), 30, f"rank {rank} "
                 "to pause")
    second = 1 - first
    os.kill(pids[first], signal.SIGTERM)
    # Lightning's handler logs, then blocks in its broadcast until the other rank's handler
    # joins it: the supervisor has read the line, so it knows who was signalled first.
    wait_for(lambda: lines.has(f"[rank {first}] [rank: {first}] Received SIGTERM"), 30,
             f"Lightning's 'Received SIGTERM' from rank {first}")
    os.kill(pids[second], signal.SIGTERM)
    wait_for(lambda: all((marks / f"got-term-{r}").exists() for r in (0, 1)), 30,
             "both ranks to take their SIGTERM")
    (marks / "go").write_text("")
    assert run.proc.poll() is None


def test_plain_lightning_ranks_sigterm_from_outside_exit_2(tmp_path: Path, marks: Path) -> None:
    """No callback: every rank is SIGTERMed directly (rank 1 first); Lightning exits 0."""
    begin = time.monotonic()
    run, lines = _launch(tmp_path, marks, "--pause-step", str(PAUSE_STEP))
    _signal_in_order(run, lines, marks, first=1)
    assert run.wait(DEADLINE) == 2
    assert time.monotonic() - begin < DEADLINE
    out = lines.text()
    assert "[rank 0] [rank: 0] Received SIGTERM: 15" in out
    assert "exit 2 EXIT_TRAINING_ERROR (interrupted: rank 1 stopped on a signal from outside)" \
        in out
    envelope = run.envelope()
    assert_interrupted_from_outside(envelope, first=1, signalled={0, 1})
    for record in envelope["ranks"]:
        assert record["stopped_at_step"] is None  # Lightning has no channel: only the log line
        assert "Received SIGTERM" in Path(record["stderr_log"]).read_text()
        assert not (marks / f"done-{record['rank']}").exists()  # SIGTERMException left fit


def test_callback_sigterm_to_one_rank_only(tmp_path: Path, marks: Path) -> None:
    """Rank 0 sends itself SIGTERM at step 5, rank 1 is never signalled: no deadlock, every rank
    stops at step 5 after the checkpoint, and Lightning's own handler never runs."""
    begin = time.monotonic()
    run, lines = _launch(tmp_path, marks, "--callback", "--ckpt", "--term-rank", "0",
                         "--term-step", "5")
    assert run.wait(DEADLINE) == 2
    assert time.monotonic() - begin < DEADLINE
    out = lines.text()
    assert "[rank 0] rank 0: sending myself SIGTERM at step 5" in out
    assert "Received SIGTERM" not in out  # Lightning's handler never ran
    envelope = run.envelope()
    assert_interrupted_from_outside(envelope, first=0, signalled={0})
    done = assert_stopped_together(envelope, marks, 5, total=400)
    checkpoint = marks / "stopped-step=5.ckpt"
    for rank in (0, 1):
        assert done[rank]["checkpoint"] == str(checkpoint)
        assert done[rank]["interrupted"] is False
    import torch

    assert torch.load(checkpoint, weights_only=False)["global_step"] == 5


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
