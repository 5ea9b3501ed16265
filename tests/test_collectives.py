"""Collective counts as progress (docs/progress.md, "Collectives"): read inside the rank (each
process group's sequence number), sent on the channel; a count that moves is progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import rank_record, rank_script, start

from forgelm_tui import channel
from forgelm_tui.channel import Message, MessageKind
from forgelm_tui.engine.progress import ProgressReader
from forgelm_tui.engine.states import ProgressEvidence
from forgelm_tui.plan.planner import Planner, collective_env
from forgelm_tui.rank import collectives
from forgelm_tui.rank.collectives import COLLECTIVES_ENV

pytestmark = pytest.mark.timeout(90)


def test_no_counts_before_the_program_initialised_torch_distributed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    assert collectives.read_counts() is None  # and torch was not imported to find out
    assert "torch" not in sys.modules or "torch.distributed" not in sys.modules
    monkeypatch.setenv(COLLECTIVES_ENV, "0")
    assert collectives.install(lambda *a, **k: None) is False  # not asked: no thread


def test_a_collectives_message_keeps_two_ints_per_group() -> None:
    data = channel.encode(1, MessageKind.COLLECTIVES,
                          groups={"0": 7, "1": [1], "2": "a", "3": 2, "4": 2.5, "5": True})
    message = channel.decode(data)
    assert message is not None and message.kind is MessageKind.COLLECTIVES
    assert message.groups == {"0": 7, "3": 2}


def _collectives(rank: int, at: float, **groups: int) -> Message:
    return Message(rank, MessageKind.COLLECTIVES, at, groups=dict(groups))


def test_only_a_count_that_moved_is_progress() -> None:
    reader = ProgressReader(lambda event: None)
    record = rank_record(0, pid=10, started_mono=0.0)
    record.last_progress_mono = 0.0
    record.progress_evidence = ProgressEvidence.OUTPUT  # it printed a banner once
    reader.read_message(record, _collectives(0, 1.0, g0=3))
    first = record.last_progress_mono
    assert first > 0.0 and record.collectives == {"g0": 3}
    reader.read_message(record, _collectives(0, 2.0, g0=3, g1=0))  # a new group, no collective
    assert record.last_progress_mono == first
    reader.read_message(record, _collectives(0, 3.0, g0=4, g1=0))
    assert record.last_progress_mono > first
    # a background thread's report: the rank's level stays, its bars are still read
    assert record.progress_evidence is ProgressEvidence.OUTPUT and not record.channel_seen


def _planned(tmp_path: Path, *args: str) -> tuple[list[str], dict[str, str], bool]:
    plan = Planner(["--run-dir", str(tmp_path / "run"), *args], "test").plan()
    return list(plan.spec.argv), dict(plan.spec.extra_env), plan.info.collective_trace


def test_python_ranks_run_observed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    argv, env, on = _planned(tmp_path, str(script), "--lr", "1")  # on by default
    assert argv[1:] == ["-u", "-m", "forgelm_tui.rank.observed", str(script), "--lr", "1"]
    assert env == {COLLECTIVES_ENV: "1"} == collective_env() and on
    argv, env, on = _planned(tmp_path, "--collective-trace", "off", str(script))
    assert argv[1:] == ["-u", str(script)] and env == {} and not on
    argv, _, on = _planned(tmp_path, "--collective-trace", "on", "--graceful", str(script))
    assert argv[1:] == ["-u", "-m", "forgelm_tui.rank.graceful", str(script)] and on
    argv, env, on = _planned(tmp_path, "--no-python", "true")
    assert argv == ["true"] and env == {} and not on


def test_silent_training_is_not_stalled_while_its_collectives_complete(tmp_path: Path) -> None:
    """Three runs at once, --stall-timeout 4. A gloo loop: a banner, then 7 s of silent
    training: ends 0; the same without the collective trace is stopped as stalled (what the
    evidence changes). Issue 22's case: a plain Lightning DDP run (no helper, its progress bar
    off) prints once, then trains silently: 30 steps of 0.2 s end 0 after every step."""
    out = tmp_path / "out"
    out.mkdir()
    runs = {}
    for name, args in (
            ("on", ["--collective-trace", "on", rank_script("silent_gloo.py"), "7"]),
            ("off", ["--collective-trace", "off", rank_script("silent_gloo.py"), "7"]),
            ("lightning", [rank_script("lightning_job.py"), str(out), "--steps", "30",
                           "--step-time", "0.2"])):
        (tmp_path / name).mkdir()
        runs[name] = start(["--nproc-per-node", "2", "--standalone", "--stall-timeout", "4",
                            *args], tmp_path / name)
    for run in runs.values():
        run.wait(85)
    run, off, lightning = runs["on"], runs["off"], runs["lightning"]
    envelope = run.envelope()
    assert run.proc.returncode == 0, run.output()
    assert envelope["stop"] is None and envelope["settings"]["collective_trace"] is True
    for rank in envelope["ranks"]:
        (count,) = rank["collectives"].values()  # the default group's, said once a second
        assert 35 <= count <= 70, rank["collectives"]
    assert off.proc.returncode == 2 and off.envelope()["stop"]["kind"] == "stall"
    assert all(r["collectives"] is None for r in off.envelope()["ranks"])
    assert lightning.proc.returncode == 0, lightning.output()
    assert lightning.envelope()["stop"] is None
    done = [json.loads((out / f"done-{rank}").read_text()) for rank in (0, 1)]
    assert [d["global_step"] for d in done] == [30, 30]


def test_a_program_without_torch_distributed_gets_no_thread(tmp_path: Path) -> None:
    """The observed runner changes nothing a program can see: no thread until it imports
    torch.distributed, its argv, __main__ and sys.path[0] as python gives them."""
    script = tmp_path / "probe.py"
    script.write_text("import sys, threading\n"
                      "print(threading.active_count(), sys.argv, __name__, sys.path[0])\n"
                      "print(sorted(m for m in sys.modules if m.startswith('forgelm_tui')))\n")
    env = {**os.environ, COLLECTIVES_ENV: "1"}
    out = subprocess.run([sys.executable, "-m", "forgelm_tui.rank.observed", str(script), "x"],
                         env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.split(maxsplit=1)[0] == "1"
    assert f"['{script}', 'x'] __main__ {tmp_path}" in out
    # and nothing it may never use: every Python rank pays the runner's imports at its start
    # and exit (the exit -> peer latency, bench/RESULTS.md "Session 14")
    assert out.splitlines()[1] == str(["forgelm_tui", "forgelm_tui.rank",
                                       "forgelm_tui.rank.collectives",
                                       "forgelm_tui.rank.program"])
