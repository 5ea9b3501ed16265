"""Every signal that can end a rank is handled and named (issue 12, item 4): 1..64, real-time
ones and glibc's reserved 32 and 33 included; pure over every number, and real ranks."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from conftest import rank_script, ready_pids, run_cli, start

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import Purpose
from forgelm_tui.envelope.entries import sig_name as _sig_name
from forgelm_tui.headless.view import _ending
from forgelm_tui.signames import signal_name, signal_number
from forgelm_tui.tui.model import RankRow
from forgelm_tui.verdict import Contract, RankEnding, decide, describe, rank_code

pytestmark = pytest.mark.timeout(60)

RTMIN, RTMAX = int(signal.SIGRTMIN), int(signal.SIGRTMAX)
NUMBERS = range(1, 65)


@pytest.mark.fault("F06")
@pytest.mark.parametrize("number", NUMBERS)
def test_every_function_that_names_a_signal_names_every_number(number: int) -> None:
    name = signal_name(number)
    assert name.startswith("SIG") and len(name) > 3
    assert signal_number(name) == number  # kill -l's names go both ways
    assert _sig_name(number) == name
    assert _ending(None, number) == f"killed by {name}"
    assert describe(128 + number)[0] == f"SIGNAL_{name}"
    assert rank_code(RankEnding(1, None, number, 1.0, False), Contract.RAW) == 128 + number
    verdict = decide([RankEnding(0, None, signal.SIGTERM, 2.0, True),
                      RankEnding(1, None, number, 1.0, False)], None, Contract.RAW)
    assert verdict.code == 128 + number and name in verdict.rule_text
    row = RankRow(1, signal=number, sent=[(number, Purpose.FORWARD, "forwarded")])
    assert row.signal_text().startswith(name)
    assert RankRow(1, signal=number).signal_text() == f"{name}, not sent by forgelm-tui"


def test_real_time_names_are_kill_l_names() -> None:
    assert [signal_name(n) for n in (32, 33, RTMIN, RTMIN + 3, RTMAX - 1, RTMAX)] == [
        "SIG32", "SIG33", "SIGRTMIN", "SIGRTMIN+3", "SIGRTMAX-1", "SIGRTMAX"]
    assert signal_number("rtmin+6") == RTMIN + 6 and signal_number("SIGRTMAX-0") == RTMAX
    assert signal_number("SIGRTMIN-1") is None and signal_number("NOPE") is None


# Every kind of signal whose default action ends a process: terminate or dump core, catchable
# or not (SIGKILL), the classic ones, glibc's reserved 32 and 33, real-time ones (SIGRTMIN+3 is
# the one forgelm-tui reserves for stacks: a rank killed by it from outside is still a death).
DEADLY = [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGABRT, signal.SIGBUS,
          signal.SIGKILL, signal.SIGSEGV, signal.SIGPIPE, signal.SIGALRM, signal.SIGTERM,
          signal.SIGSTKFLT, signal.SIGXCPU, signal.SIGSYS, 32, 33, RTMIN, RTMIN + 3,
          RTMIN + 16, RTMAX - 1, RTMAX]


@pytest.mark.fault("F06")
def test_a_rank_killed_by_any_signal_is_named_and_its_peer_stopped(tmp_path: Path,
                                                                   marks: Path) -> None:
    """One run of len(DEADLY) ranks, each killed by a signal of its own, all at once (they
    ignore the stop's SIGTERM): every real death named, the first one the root cause with its
    128+N. (Each number's verdict and code: the pure test above; a peer stopped at once after a
    real-time death: the test below.)"""
    numbers = [int(n) for n in DEADLY]
    run = start(["--nproc-per-node", str(len(numbers)), "--grace", "5", "--exit-contract", "raw",
                 rank_script("die_together.py"), str(marks), ",".join(map(str, numbers))],
                tmp_path)
    ready_pids(marks, len(numbers))
    (marks / "go").touch()
    assert run.wait(30) > 128
    out, err = run.output()
    assert "Traceback" not in out + err
    envelope = run.envelope()
    assert envelope["supervisor_error"] is None
    undeliverable = []
    for rank, number in enumerate(numbers):
        name, ended = signal_name(number), envelope["ranks"][rank]
        if ended["exit_code"] == 99:
            undeliverable.append(name)  # not deliverable to a Python process here
            continue
        assert ended["signal"] == name and ended["exit_code"] is None, ended
        assert f"rank {rank} killed by {name}" in out
    assert len(undeliverable) < len(numbers) // 2, undeliverable
    cause = envelope["root_cause_rank"]
    name = signal_name(numbers[cause])
    assert run.proc.returncode == 128 + numbers[cause], err
    assert envelope["decided_by"] == {
        "rule": 2, "rank": cause, "node": None,
        "explanation": f"root cause: rank {cause} failed on its own (signal {name})"}
    assert envelope["ranks"][cause]["signalled_by_supervisor"] is False


@pytest.mark.fault("F06")
def test_a_real_time_death_under_the_forgelm_contract_is_2(tmp_path: Path) -> None:
    begin = time.monotonic()
    run = run_cli(["--nproc-per-node", "2", "--grace", "5", rank_script("die_of_signal.py"),
                   "0", str(RTMIN + 6)], tmp_path)
    assert run.wait() == 2
    assert time.monotonic() - begin < 20  # the peer was stopped, not left to sleep 60 s
    out, err = run.output()
    assert "Traceback" not in out + err
    envelope = run.envelope()
    rank0, rank1 = envelope["ranks"]
    assert rank0["signal"] == "SIGRTMIN+6" and rank0["signalled_by_supervisor"] is False
    assert rank1["signalled_by_supervisor"] is True
    assert envelope["decided_by"] == {
        "rule": 2, "rank": 0, "node": None,
        "explanation": "root cause: rank 0 failed on its own (signal SIGRTMIN+6)"}
    assert "rank 0 killed by SIGRTMIN+6" in out
    assert envelope["supervisor_error"] is None


def test_events_carry_any_signal_number() -> None:
    from forgelm_tui.engine.codec import from_wire, to_wire

    for number in NUMBERS:
        event = ev.RankExited(1, None, number, False, 1.0)
        assert from_wire(to_wire(event)) == event
