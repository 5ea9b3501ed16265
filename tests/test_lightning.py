"""Lightning DDP ranks (CPU, gloo) under forgelm-tui, signalled from outside the supervisor.

forgelm-tui gives each rank torchrun's environment, so Lightning (``strategy="ddp"``,
``devices=2``) detects torchelastic and does not spawn processes of its own
(tests/ranks/lightning_job.py). Plain Lightning 2.6 stops a SIGTERMed rank by raising
``SIGTERMException`` (a ``SystemExit``): the rank exits 0 and logs ``Received SIGTERM``;
forgelm-tui reads that line and reports the run as interrupted, exit 2 (rule 4), naming the rank
signalled first. With ``forgelm_tui.rank.lightning.StopTogetherCallback`` a SIGTERM to one rank
only stops every rank at the same step, after a checkpoint (plain Lightning deadlocks there: its
handler broadcasts inside the handler, against the peer's gradient all-reduce).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import pytest
from conftest import Run, rank_script, ready_pids, start, wait_for

pytest.importorskip("lightning")

pytestmark = pytest.mark.timeout(75)
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


def _done(marks: Path, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((marks / f"done-{rank}").read_text())
    return data


def _signal_in_order(run: Run, lines: Lines, marks: Path, first: int, *,
                     plain: bool) -> None:
    """Both ranks paused at PAUSE_STEP: SIGTERM ``first``, see it taken, then the other, then go."""
    pids = ready_pids(marks, 2)
    for rank in (0, 1):
        wait_for(lambda r=rank: lines.has(f"[rank {r}] rank {r}: paused"), 30, f"rank {rank} "
                 "to pause")
    second = 1 - first
    os.kill(pids[first], signal.SIGTERM)
    if plain:
        # Lightning's handler logs, then blocks in its broadcast until the other rank's handler
        # joins it: the supervisor has read the line, so it knows who was signalled first.
        wait_for(lambda: lines.has(f"[rank {first}] [rank: {first}] Received SIGTERM"), 30,
                 f"Lightning's 'Received SIGTERM' from rank {first}")
    else:
        wait_for(lambda: (marks / f"got-term-{first}").exists(), 30, f"rank {first}'s handler")
    os.kill(pids[second], signal.SIGTERM)
    wait_for(lambda: all((marks / f"got-term-{r}").exists() for r in (0, 1)), 30,
             "both ranks to take their SIGTERM")
    (marks / "go").write_text("")
    assert run.proc.poll() is None


def _assert_outside_stop(envelope: dict[str, Any], first: int, signalled: set[int]) -> None:
    assert envelope["exit_code"] == 2
    assert envelope["exit_name"] == "EXIT_TRAINING_ERROR"
    assert envelope["decided_by"]["rule"] == 4
    assert envelope["decided_by"]["rank"] == first
    assert f"rank {first} stopped on a signal from outside" in envelope["decided_by"][
        "explanation"]
    assert envelope["outside_signal"] == {"rank": first, "signal": "SIGTERM",
                                          "ranks": sorted(signalled)}
    assert envelope["stop"] is None and envelope["cancelled"] is None
    for record in envelope["ranks"]:
        outside = record["rank"] in signalled
        assert record["exit_code"] == 0 and record["signal"] is None, record
        assert record["signalled_by_supervisor"] is False and record["signals_sent"] == []
        assert record["stopped_from_outside"] is outside
        assert record["reported_signal"] == ("SIGTERM" if outside else None)


def test_plain_lightning_ranks_sigterm_from_outside_exit_2(tmp_path: Path, marks: Path) -> None:
    """No callback: every rank is SIGTERMed directly (rank 1 first); Lightning exits 0."""
    begin = time.monotonic()
    run, lines = _launch(tmp_path, marks, "--pause-step", str(PAUSE_STEP))
    _signal_in_order(run, lines, marks, first=1, plain=True)
    assert run.wait(DEADLINE) == 2
    assert time.monotonic() - begin < DEADLINE
    out = lines.text()
    assert "[rank 0] [rank: 0] Received SIGTERM: 15" in out
    assert "exit 2 EXIT_TRAINING_ERROR (interrupted: rank 1 stopped on a signal from outside)" \
        in out
    envelope = run.envelope()
    _assert_outside_stop(envelope, first=1, signalled={0, 1})
    for record in envelope["ranks"]:
        assert record["stopped_at_step"] is None  # Lightning has no channel: only the log line
        assert "Received SIGTERM" in Path(record["stderr_log"]).read_text()
        assert not (marks / f"done-{record['rank']}").exists()  # SIGTERMException left fit


def test_callback_ranks_sigterm_from_outside_stop_together(tmp_path: Path, marks: Path) -> None:
    """With the callback: the same signals, rank 1 first; both stop at the paused step."""
    begin = time.monotonic()
    run, lines = _launch(tmp_path, marks, "--callback", "--ckpt", "--pause-step",
                         str(PAUSE_STEP))
    _signal_in_order(run, lines, marks, first=1, plain=False)
    assert run.wait(DEADLINE) == 2
    assert time.monotonic() - begin < DEADLINE
    assert "Received SIGTERM" not in lines.text()  # Lightning's handler never ran
    envelope = run.envelope()
    _assert_outside_stop(envelope, first=1, signalled={0, 1})
    _assert_stopped_together(envelope, marks, PAUSE_STEP)


@pytest.mark.parametrize("signalled", [0, 1])
def test_callback_sigterm_to_one_rank_only(tmp_path: Path, marks: Path, signalled: int) -> None:
    """One rank sends itself SIGTERM at step 5: no deadlock, every rank stops at step 5."""
    begin = time.monotonic()
    run, lines = _launch(tmp_path, marks, "--callback", "--ckpt", "--term-rank",
                         str(signalled), "--term-step", "5")
    assert run.wait(DEADLINE) == 2
    assert time.monotonic() - begin < DEADLINE
    out = lines.text()
    assert f"[rank {signalled}] rank {signalled}: sending myself SIGTERM at step 5" in out
    envelope = run.envelope()
    _assert_outside_stop(envelope, first=signalled, signalled={signalled})
    _assert_stopped_together(envelope, marks, 5)


def _assert_stopped_together(envelope: dict[str, Any], marks: Path, step: int) -> None:
    ended = []
    for record in envelope["ranks"]:
        rank = record["rank"]
        assert record["stopped_at_step"] == step, record
        assert record["progress"]["step"] == step and record["progress"]["source"] == "channel"
        assert record["progress"]["total"] == 400
        done = _done(marks, rank)
        assert done == {"global_step": step, "stopped": True, "stopped_at_step": step,
                        "checkpoint": str(marks / f"stopped-step={step}.ckpt"),
                        "interrupted": False, "sigterm_handler_restored": True}, done
        ended.append(datetime.fromisoformat(record["ended_at"].replace("Z", "+00:00")))
    assert abs((ended[0] - ended[1]).total_seconds()) < 5  # no rank left waiting for a peer
    checkpoint = marks / f"stopped-step={step}.ckpt"
    assert checkpoint.exists()
    import torch

    assert torch.load(checkpoint, weights_only=False)["global_step"] == step


def test_callback_single_process_saves_into_the_model_checkpoint_dir(tmp_path: Path,
                                                                     marks: Path) -> None:
    """No process group; no checkpoint path: the stop checkpoint goes to ModelCheckpoint's dir."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, rank_script("lightning_job.py"), str(marks), "--single",
                           "--callback", "--model-checkpoint", "--term-rank", "0", "--term-step",
                           "3"], env=env, capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint = marks / "ckpts" / "stopped-step=3.ckpt"
    assert _done(marks, 0) == {"global_step": 3, "stopped": True, "stopped_at_step": 3,
                               "checkpoint": str(checkpoint), "interrupted": False,
                               "sigterm_handler_restored": True}
    assert checkpoint.exists()


def test_a_lightning_rank_that_raises_is_a_crash(tmp_path: Path, marks: Path) -> None:
    """Lightning re-raises a training step's exception: exit 1 with a traceback, a crash: 2."""
    run, _lines = _launch(tmp_path, marks, "--raise-rank", "1", "--raise-step", "3")
    assert run.wait(DEADLINE) == 2
    envelope = run.envelope()
    assert envelope["root_cause_rank"] == 1 and envelope["ranks"][1]["exit_code"] == 1
    assert envelope["exception"]["type"] == "RuntimeError"
    assert "simulated crash in training_step" in envelope["exception"]["message"]
