"""Lightning DDP ranks (CPU, gloo) under forgelm-tui, signalled from outside the supervisor.

forgelm-tui gives each rank torchrun's environment, so Lightning (``strategy="ddp"``,
``devices=2``) detects torchelastic and does not spawn processes of its own
(tests/ranks/lightning_job.py). Plain Lightning 2.6 stops a SIGTERMed rank by raising
``SIGTERMException`` (a ``SystemExit``): the rank exits 0 and logs ``Received SIGTERM``;
forgelm-tui reads that line and reports the run as interrupted, exit 2 (rule 4), naming the rank
signalled first. With ``forgelm_tui.rank.lightning.StopTogetherCallback`` a SIGTERM to one rank
only stops every rank at the same step, after a checkpoint (plain Lightning deadlocks there: its
handler broadcasts inside the handler, against the peer's gradient all-reduce).

Single-process Lightning (the callback without a process group; a training step that raises):
test_trainers_in_process.py.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from conftest import Run, rank_script, ready_pids, start, wait_for
from stop_checks import assert_interrupted_from_outside, assert_stopped_together

# Not imported here: collecting this file costs no import of lightning (seconds of CPU in
# every xdist worker); the ranks import it.
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
        assert done[rank]["checkpoint_global_step"] == 5  # as each rank read the file back
    assert checkpoint.is_file()
