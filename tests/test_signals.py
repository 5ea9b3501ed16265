"""Signals to the supervisor: one-pass stop, grace deadline, second cancel, forwarding, SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import pid_alive, rank_script, ready_pids, start, wait_for

pytestmark = pytest.mark.timeout(60)


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.mark.fault("F07")
@pytest.mark.parametrize(
    ("contract", "sig", "expected"),
    [("forgelm", signal.SIGTERM, 2), ("raw", signal.SIGTERM, 143), ("raw", signal.SIGINT, 130),
     ("raw", signal.SIGHUP, 129)],
)
def test_stop_signal_reaches_every_rank_in_one_pass(
    tmp_path: Path, marks: Path, contract: str, sig: int, expected: int
) -> None:
    run = start(["--nproc-per-node", "3", "--exit-contract", contract,
                 rank_script("sleeper.py"), str(marks)], tmp_path)
    ready_pids(marks, 3)
    run.signal(sig)
    assert run.wait(30) == expected
    envelope = run.envelope()
    assert envelope["cancelled"]["by"] == f"{signal.Signals(sig).name} to the supervisor"
    assert envelope["decided_by"]["rule"] == 4
    for rank in range(3):
        assert (marks / f"got-SIGTERM-{rank}").exists()
    sent = [_at(r["signalled_at"]) for r in envelope["ranks"]]
    assert max(sent) - min(sent) < 0.1, "all ranks must be signalled in one pass"
    assert all(r["signal"] == "SIGTERM" for r in envelope["ranks"])


@pytest.mark.fault("F10")
def test_rank_ignoring_sigterm_is_killed_at_grace_deadline(tmp_path: Path, marks: Path) -> None:
    # A 1 s grace: the deadline's rule is the policy's (test_policy.py, an injected clock);
    # this checks the real SIGKILL at it.
    run = start(["--nproc-per-node", "2", "--grace", "1",
                 rank_script("sleeper.py"), str(marks), "--ignore-term", "1"], tmp_path)
    ready_pids(marks, 2)
    begin = time.monotonic()
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    elapsed = time.monotonic() - begin
    assert 0.9 < elapsed < 5, elapsed
    rank1 = run.envelope()["ranks"][1]
    assert rank1["signal"] == "SIGKILL"
    term, kill = rank1["signals_sent"][:2]
    assert (term["signal"], kill["signal"]) == ("SIGTERM", "SIGKILL")
    assert kill["purpose"] == "kill" and "grace of 1 s ended" in kill["reason"]
    assert 0.9 < _at(kill["at"]) - _at(term["at"]) < 2.0


@pytest.mark.fault("F22")
def test_second_sigint_kills_at_once(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", "--grace", "30", "--exit-contract", "raw",
                 rank_script("sleeper.py"), str(marks), "--ignore-term", "0"], tmp_path)
    ready_pids(marks, 2)
    begin = time.monotonic()
    run.signal(signal.SIGINT)
    wait_for(lambda: (marks / "got-SIGTERM-0").exists(), 10, "rank 0 to get SIGTERM")
    # from another process: a repeat from the same one within 1 s is the same request (a
    # burst, test_outside_signals.py)
    subprocess.run([sys.executable, "-c", f"import os; os.kill({run.proc.pid}, 2)"], check=True)
    assert run.wait(30) == 130
    assert time.monotonic() - begin < 10
    envelope = run.envelope()
    assert envelope["cancelled"]["requests"] == 2
    rank0 = envelope["ranks"][0]
    assert rank0["signal"] == "SIGKILL"
    assert "second cancel" in rank0["signals_sent"][-1]["reason"]


@pytest.mark.fault("F25")
def test_sigusr1_is_forwarded_and_the_run_goes_on(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", rank_script("sleeper.py"), str(marks), "--sleep", "1.5"],
                tmp_path)
    ready_pids(marks, 2)
    run.signal(signal.SIGUSR1)
    wait_for(lambda: all((marks / f"got-SIGUSR1-{r}").exists() for r in range(2)), 10,
             "both ranks to get SIGUSR1")
    assert run.wait(30) == 0
    envelope = run.envelope()
    assert envelope["stop"] is None
    for rank in envelope["ranks"]:
        assert rank["exit_code"] == 0
        assert rank["signalled_by_supervisor"] is False
        assert [s["purpose"] for s in rank["signals_sent"]] == ["forward"]


@pytest.mark.fault("F20")
@pytest.mark.parametrize(("contract", "code"), [("forgelm", 2), ("raw", 138)])
def test_a_rank_ended_by_a_forwarded_signal_interrupts_the_run(
        tmp_path: Path, marks: Path, contract: str, code: int) -> None:
    """SLURM's SIGUSR1 to the supervisor reaches a rank with no handler: it dies of it. That is
    no failure of its own: the peer is stopped at once (it would hang in the next collective)
    and the run is interrupted."""
    run = start(["--nproc-per-node", "2", "--grace", "5", "--exit-contract", contract,
                 rank_script("sleeper.py"), str(marks), "--no-usr1", "0"], tmp_path)
    ready_pids(marks, 2)
    run.signal(signal.SIGUSR1)
    assert run.wait(30) == code
    envelope = run.envelope()
    assert envelope["stop"]["kind"] == "forwarded" and envelope["stop"]["signal"] == "SIGUSR1"
    assert envelope["decided_by"]["rule"] == 4 and envelope["root_cause_rank"] is None
    assert envelope["decided_by"]["explanation"] == (
        "interrupted: rank 0 ended on SIGUSR1, forwarded by forgelm-tui")
    rank0, rank1 = envelope["ranks"]
    assert rank0["signal"] == "SIGUSR1" and rank0["forwarded_death"] is True
    assert rank0["stderr_tail"] is None  # not a failed rank
    assert rank1["signalled_by_supervisor"] is True
    assert rank1["signals_sent"][-1]["reason"] == (
        "rank 0 ended on SIGUSR1, forwarded by forgelm-tui")


@pytest.mark.fault("F27")
def test_sigkill_of_supervisor_leaves_no_rank_or_child(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "3", rank_script("sleeper.py"), str(marks), "--child",
                 "--ignore-term", "2"], tmp_path)
    pids = ready_pids(marks, 3)
    assert len(pids) == 6 and all(pid_alive(p) for p in pids)
    run.signal(signal.SIGKILL)
    run.wait(10)
    killed = time.monotonic()
    wait_for(lambda: not any(pid_alive(p) for p in pids), 5, "every rank and child to be gone")
    assert time.monotonic() - killed < 2.5


@pytest.mark.fault("F22")
def test_sigterm_stop_writes_provisional_envelope_first(tmp_path: Path, marks: Path) -> None:
    # The rank ignores SIGTERM; while the grace runs, the envelope on disk says "stopping".
    run = start(["--nproc-per-node", "2", "--grace", "20", rank_script("sleeper.py"), str(marks),
                 "--ignore-term", "1"], tmp_path)
    ready_pids(marks, 2)
    run.signal(signal.SIGTERM)
    envelope_path = run.run_dir / "envelope.json"
    wait_for(envelope_path.exists, 10, "the provisional envelope")
    envelope = run.envelope()
    assert envelope["provisional"] is True
    assert envelope["stop"]["reason"] == "cancelled by SIGTERM to the supervisor"
    states = {r["rank"]: r["state"] for r in envelope["ranks"]}
    assert states[1] == "stopping"
    run.signal(signal.SIGKILL)  # as a scheduler would after its own kill wait
    run.wait(10)
    assert run.envelope()["provisional"] is True
