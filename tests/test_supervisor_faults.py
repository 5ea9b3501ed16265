"""The supervisor's own signals and its own errors (issue 12, item 4).

SIGPIPE and SIGTTOU to a real supervisor change nothing; an exception in a listener, in a loop
callback (the sampler's results) or after the ranks ended never hangs the run: the ranks are
stopped, the envelope names the exception, the code is 2 if ranks were still running, else the
ranks' own verdict. The failures are injected in-process (no test hook in the product).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest
from conftest import pid_alive, rank_script, ready_pids, start, wait_for

from forgelm_tui.engine import events as ev
from forgelm_tui.plan.planner import Planner
from forgelm_tui.session.run import Session

pytestmark = pytest.mark.timeout(60)


@pytest.mark.fault("F26")
def test_sigpipe_and_sigttou_to_the_supervisor_change_nothing(
        tmp_path: Path, marks: Path) -> None:
    """SIGPIPE's default would kill it (a closed stdout is EPIPE, handled where it writes);
    SIGTTOU's would stop it, and its ranks would block on full pipes: both are ignored (one
    run gets both, twice each)."""
    run = start(["--nproc-per-node", "2", rank_script("sleeper.py"), str(marks), "--sleep", "2"],
                tmp_path)
    ready_pids(marks, 2)
    for sig in (signal.SIGPIPE, signal.SIGTTOU, signal.SIGPIPE, signal.SIGTTOU):
        run.signal(sig)
    assert run.wait(30) == 0  # killed: -13; a stopped supervisor never ends: a time-out
    envelope = run.envelope()
    assert envelope["stop"] is None and envelope["cancelled"] is None
    assert envelope["supervisor_error"] is None


def _session(tmp_path: Path, *args: str) -> Session:
    plan = Planner(["--no-tui", "--run-dir", str(tmp_path / "run"), "--grace", "5", *args],
                   "faults-" + tmp_path.name[-12:]).plan()
    return Session(plan)


def _sleepers(marks: Path) -> list[str]:
    return ["--nproc-per-node", "2", rank_script("sleeper.py"), str(marks)]


@pytest.mark.fault("F32")
def test_a_listener_that_raises_stops_the_ranks_with_an_envelope(
        tmp_path: Path, marks: Path) -> None:
    session = _session(tmp_path, *_sleepers(marks))
    pids: list[int] = []

    def view(event: ev.Event) -> None:
        if isinstance(event, ev.RankStarted):
            pids.append(event.pid)
        if isinstance(event, ev.RankOutput) or len(pids) == 2:
            raise RuntimeError("the view broke")

    session.subscribe(view)
    begin = time.monotonic()
    ending = asyncio.run(session.run())
    assert time.monotonic() - begin < 20
    assert ending.verdict.code == 2 and ending.verdict.rule == 4
    envelope = ending.envelope
    error = envelope["supervisor_error"]
    assert (error["type"], error["message"]) == ("RuntimeError", "the view broke")
    assert error["where"].startswith("listener ") and error["ranks_running"] is True
    assert any("raise RuntimeError" in line for line in error["traceback"])
    assert "forgelm-tui failed (RuntimeError: the view broke)" in envelope["decided_by"][
        "explanation"]
    assert envelope["cancelled"]["source"] == "supervisor"
    assert all(r["signalled_by_supervisor"] for r in envelope["ranks"])
    assert (tmp_path / "run" / "envelope.json").exists()
    wait_for(lambda: not any(pid_alive(p) for p in pids), 5, "every rank to be gone")


@pytest.mark.fault("F32")
def test_a_sampler_that_raises_stops_the_ranks(tmp_path: Path, marks: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler's results are applied in a loop callback: its exception reaches the loop's
    exception handler, never a bare traceback."""
    import forgelm_tui.engine.supervisor as supervisor

    def broken(*_: object) -> None:
        raise ValueError("psutil said no")

    monkeypatch.setattr(supervisor, "apply_sample", broken)
    session = _session(tmp_path, *_sleepers(marks))
    ending = asyncio.run(session.run())
    error = ending.envelope["supervisor_error"]
    assert ending.verdict.code == 2
    assert (error["type"], error["message"]) == ("ValueError", "psutil said no")
    assert error["where"].startswith("loop callback")
    assert ending.envelope["stop"]["reason"].startswith("cancelled by forgelm-tui itself")


@pytest.mark.fault("F32")
def test_an_error_after_the_ranks_ended_keeps_their_verdict(tmp_path: Path) -> None:
    session = _session(tmp_path, "--nproc-per-node", "2", rank_script("exit_with.py"), "4",
                       "1=0")

    def view(event: ev.Event) -> None:
        if isinstance(event, ev.RunFinished | ev.VerdictReached):
            raise KeyError("late")

    session.subscribe(view)
    ending = asyncio.run(session.run())
    assert ending.verdict.code == 4  # the ranks' own verdict: they had all ended
    error = ending.envelope["supervisor_error"]
    assert error["type"] == "KeyError" and error["ranks_running"] is False
    assert ending.envelope["cancelled"] is None


def test_the_headless_summary_names_the_error_and_the_attempts() -> None:
    from forgelm_tui.wording.ending import ending_notes

    envelope = {"supervisor_error": {"type": "RuntimeError", "message": "boom",
                                     "where": "listener HeadlessView.__call__"},
                "max_restarts": 2, "attempts": [
                    {"restart": {"restarted": True, "why": "restarting after x"}},
                    {"restart": {"restarted": False, "why": "the run succeeded"}}]}
    assert ending_notes(envelope) == [
        "forgelm-tui failed: RuntimeError: boom (in listener HeadlessView.__call__); the "
        "envelope has its traceback",
        "attempt 2/3 was the last: the run succeeded; each restart's logs in attempt-K/ of the "
        "run dir"]
    assert ending_notes({"supervisor_error": None, "max_restarts": 0, "attempts": []}) == []


@pytest.mark.fault("F32")
def test_the_last_net_writes_every_envelope_it_can_and_names_only_those(tmp_path: Path) -> None:
    """An exception past every other net (cli's execute): one line, the envelope in the same
    shape as every other (restart fields too), every place that could be written named."""
    from forgelm_tui.session.internal_error import report_internal_error

    blocked = tmp_path / "file"
    blocked.write_text("")
    plan = Planner(["--no-tui", "--run-dir", str(tmp_path / "run"), "--envelope",
                    str(blocked / "e.json"), rank_script("exit_with.py"), "0"],
                   "net-" + tmp_path.name[-12:]).plan()
    said: list[str] = []
    printed: list[dict[str, object]] = []
    assert report_internal_error(plan, RuntimeError("past every net"), said.append,
                                 printed.append) == 2
    envelope = json.loads((tmp_path / "run" / "envelope.json").read_text())
    assert envelope["supervisor_error"]["message"] == "past every net"
    assert (envelope["max_restarts"], envelope["restart_count"], envelope["attempts"]) == (0, 0,
                                                                                          [])
    assert said[0].startswith("forgelm-tui: internal error: RuntimeError: past every net")
    assert said[0].endswith(f"; envelope: {tmp_path / 'run' / 'envelope.json'})")
    assert len(said) == 2 and str(blocked / "e.json") in said[1]  # the place that failed
    assert printed == []  # text output: nothing on stdout
