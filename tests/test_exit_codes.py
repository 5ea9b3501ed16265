"""The true exit code reaches CI: every ForgeLM code, fail-fast, outcome ranks, drain."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import rank_script, run_cli, start

pytestmark = pytest.mark.timeout(60)


@pytest.mark.fault("F03")
def test_both_ranks_exit_with_code(tmp_path: Path) -> None:
    """Every ForgeLM code 0..6, one run each, all at once (they share nothing)."""
    runs = {}
    for code in range(7):
        (tmp_path / str(code)).mkdir()
        runs[code] = start(["--nproc-per-node", "2", rank_script("exit_with.py"), str(code)],
                           tmp_path / str(code))
    for code, run in runs.items():
        assert run.wait(60) == code
        envelope = run.envelope()
        assert envelope["exit_code"] == code
        assert envelope["provisional"] is False
        for rank in envelope["ranks"]:
            # With a failure code the first rank to end stops the other (fail fast), which may
            # then die of the supervisor's SIGTERM before it exits on its own.
            assert rank["exit_code"] == code or (code in (1, 2)
                                                 and rank["signalled_by_supervisor"])
        if code in (1, 2):
            assert envelope["decided_by"]["rule"] == 2


@pytest.mark.fault("F03")
def test_outcome_on_rank1_does_not_stop_rank0(tmp_path: Path) -> None:
    # rank 1 exits 4 at once; rank 0 keeps working for a while, then exits 3.
    run = run_cli(
        ["--nproc-per-node", "2", rank_script("exit_with.py"), "0=3", "1=4",
         "--sleep-rank", "0=1.5"],
        tmp_path,
    )
    assert run.proc.returncode == 3
    envelope = run.envelope()
    rank0 = envelope["ranks"][0]
    assert rank0["signalled_by_supervisor"] is False
    assert rank0["signals_sent"] == []
    assert rank0["exit_code"] == 3
    assert envelope["decided_by"]["rule"] == 3
    assert envelope["disagreements"] == [{"rank": 1, "exit_code": 4}]


@pytest.mark.fault("F04")
def test_drain_window_stops_late_ranks_and_keeps_rank0_code(tmp_path: Path) -> None:
    run = run_cli(
        ["--nproc-per-node", "2", "--drain", "1", "--grace", "5",
         rank_script("exit_with.py"), "4", "--sleep-rank", "1=60"],
        tmp_path,
    )
    assert run.proc.returncode == 4
    envelope = run.envelope()
    assert envelope["stop"]["kind"] == "drain"
    rank1 = envelope["ranks"][1]
    assert rank1["signalled_by_supervisor"] is True
    assert rank1["signal"] == "SIGTERM"
    assert "drain" in rank1["signalled_reason"]


@pytest.mark.fault("F05")
def test_raw_contract_keeps_codes_outside_forgelm_table(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "2", "--exit-contract", "raw",
                   rank_script("exit_with.py"), "17"], tmp_path)
    assert run.proc.returncode == 17
    run = run_cli(["--nproc-per-node", "2", rank_script("exit_with.py"), "17"], tmp_path)
    assert run.proc.returncode == 2
    envelope = run.envelope()
    assert envelope["ranks"][envelope["root_cause_rank"]]["exit_code"] == 17


@pytest.mark.fault("F07")
@pytest.mark.timeout(90)
def test_failed_rank_stops_peer_waiting_in_gloo_barrier(tmp_path: Path) -> None:
    run = run_cli(
        ["--nproc-per-node", "2", "--grace", "10", rank_script("gloo_barrier.py"), "1", "2"],
        tmp_path,
        timeout=80,
    )
    assert run.proc.returncode == 2
    envelope = run.envelope()
    assert envelope["root_cause_rank"] == 1
    assert envelope["decided_by"] == {
        "rule": 2, "rank": 1, "node": None,
        "explanation": "root cause: rank 1 failed on its own (exit 2)"}
    rank0, rank1 = envelope["ranks"]
    assert rank0["signalled_by_supervisor"] is True
    assert rank0["signalled_reason"] == "rank 1 failed (exit 2)"
    assert rank1["exit_code"] == 2
    assert rank1["stderr_tail"] and "rank 1 failing with 2" in rank1["stderr_tail"][-1]
