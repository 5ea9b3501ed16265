"""Stall detection wired to real processes: a run where no rank makes progress is stopped.

The rules (one quiet rank is only marked, heartbeats count, the quiet threshold) are tested
in-process in test_policy.py; the quiet notice of --no-tui in test_output.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import rank_script, run_cli

pytestmark = pytest.mark.timeout(60)


@pytest.mark.fault("F08")
def test_silent_idle_ranks_are_a_stall(tmp_path: Path, marks: Path) -> None:
    begin = time.monotonic()
    run = run_cli(["--nproc-per-node", "2", "--stall-timeout", "1", "--grace", "2",
                   "--exit-contract", "raw", rank_script("sleeper.py"), str(marks)], tmp_path)
    assert run.proc.returncode == 2
    assert time.monotonic() - begin < 15
    envelope = run.envelope()
    assert envelope["stop"]["kind"] == "stall"
    assert envelope["stop"]["reason"] == "stalled: no rank made progress for 1 s"
    assert [r["stalled"] for r in envelope["ranks"]] == [True, True]
    out, _ = run.output()
    assert "stalled: no progress from rank(s) 0,1 for 1 s" in out


@pytest.mark.fault("F08")
@pytest.mark.timeout(90)
def test_collective_deadlock_ends_within_stall_plus_grace(tmp_path: Path) -> None:
    """The demo's rank 1 stops taking part (it sleeps, silent: issue 22's laggard); rank 0
    blocks in DDP's gradient all-reduce: a stall, with both ranks' stacks (rank 0's read inside
    the blocked collective), and the hang named from their collective counts."""
    from conftest import start, wait_for

    run = start(["demo", "--steps", "200", "--step-time", "0.05", "--hang-rank", "1",
                 "--hang-step", "3", "--stall-timeout", "2", "--grace", "1"], tmp_path)
    log = run.run_dir / "rank-1.stdout.log"
    wait_for(lambda: log.exists() and "stops taking part" in log.read_text(), 60, "the hang")
    hung = time.monotonic()
    assert run.wait(30) == 2
    assert time.monotonic() - hung < 9
    envelope = run.envelope()
    assert envelope["stop"]["kind"] == "stall"
    assert [r["stalled"] for r in envelope["ranks"]] == [True, True]
    assert envelope["decided_by"]["explanation"] == "stalled: no rank made progress"
    rank0, rank1 = envelope["ranks"]
    assert rank1["stuck_at"].split(" ")[-1] == "stuck_forever", rank1
    assert rank0["stuck_at"] is not None and rank0["stacks_via"] == "faulthandler"
    assert all(Path(r["stacks_file"]).exists() for r in (rank0, rank1))
    hang = envelope["hang"]
    assert (hang["missing_ranks"], hang["waiting_ranks"]) == ([1], [0]), hang
    assert hang["collective"]["op"] == "all_reduce", rank0["stuck_at"]
    assert hang["collective"]["seq"] == rank0["collectives"]["0"] > rank1["collectives"]["0"]
