"""Where the ranks were stuck (issue 13, items 2 and 3): every live rank's Python stacks, all
threads, before a stall stop (and on request: SIGQUIT to the supervisor, `t` in the TUI), within
a bounded time, then the stop as before.

The policy part runs in-process on the injected clock (policy_harness); the capture on real
processes, in-process and through the real CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import rank_script, ready_pids, run_cli, start, wait_for
from policy_harness import Harness, harness

from forgelm_tui.channel import (
    CHANNEL_ENV,
    STACKS_ENV,
    STACKS_SIGNAL,
    MessageKind,
    decode,
    encode,
    socket_address,
)
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import Purpose
from forgelm_tui.engine.progress import ProgressReader
from forgelm_tui.engine.records import CancelSource, RankRecord, StacksHandler, StopRecord
from forgelm_tui.engine.stack_text import (
    faulthandler_threads,
    innermost,
    py_spy_threads,
    short_frame,
)
from forgelm_tui.engine.stacks import StackCapture, find_py_spy
from forgelm_tui.headless.view import stacks_lines
from forgelm_tui.signames import signal_name
from forgelm_tui.verdict import StopKind

pytestmark = pytest.mark.timeout(60)
PY_SPY = find_py_spy()
RESERVED = signal_name(STACKS_SIGNAL)


# ---------------------------------------------------------------------- the policy, in-process


def _stall(h: Harness, timeout: float = 5.0) -> None:
    h.advance(timeout)
    h.policy.progress_checked(h.clock.now)


def test_a_stall_captures_the_stacks_then_stops() -> None:
    h = harness(2, stall_timeout=5.0, grace=2.0, stacks_deadline=2.0)
    h.effects.hold_stacks = True
    _stall(h)
    assert h.effects.of(ev.RunStalled) and h.policy.stop is None  # declared; not stopped yet
    assert [(ranks, reason) for ranks, reason, _ in h.effects.captures] == [((0, 1), "stall")]
    assert h.effects.sent == []  # no SIGTERM before the stacks are in
    h.advance(0.3)
    h.policy.progress_checked(h.clock.now)  # a sample pass meanwhile: no second capture
    assert len(h.effects.captures) == 1
    h.effects.captures[0][2]()  # the capture is done
    stop = h.policy.stop
    assert stop is not None and stop.kind is StopKind.STALL
    assert stop.stacks_delay == pytest.approx(0.3)
    assert h.effects.signals(signal.SIGTERM) == [0, 1]
    h.advance(2.0)  # the grace is honoured as for any stop
    assert h.effects.signals(signal.SIGKILL) == [0, 1]


def test_a_capture_that_never_ends_delays_the_stop_by_the_deadline_only() -> None:
    h = harness(2, stall_timeout=5.0, grace=3.0, stacks_deadline=2.0)
    h.effects.hold_stacks = True
    _stall(h)
    h.advance(1.99)
    assert h.policy.stop is None
    h.advance(0.02)
    assert h.policy.stop is not None and h.policy.stop.stacks_delay == pytest.approx(2.0)
    h.effects.captures[0][2]()  # the capture's late end begins nothing more
    assert len(h.effects.of(ev.RunStopping)) == 1
    h.advance(2.99)
    assert h.effects.signals(signal.SIGKILL) == []
    h.advance(0.02)
    assert h.effects.signals(signal.SIGKILL) == [0, 1]


def test_a_cancel_or_a_failure_during_the_capture_stops_at_once() -> None:
    h = harness(2, stall_timeout=5.0, stacks_deadline=2.0)
    h.effects.hold_stacks = True
    _stall(h)
    h.policy.cancel(CancelSource.OPERATOR, "operator", signal.SIGINT)
    assert h.policy.stop is not None and h.policy.stop.kind is StopKind.CANCEL
    h.advance(5.0)  # neither the deadline nor the capture's end begins a second stop
    h.effects.captures[0][2]()
    assert len(h.effects.of(ev.RunStopping)) == 1
    h2 = harness(2, stall_timeout=5.0, stacks_deadline=2.0)
    h2.effects.hold_stacks = True
    _stall(h2)
    h2.end(1, 9)
    assert h2.policy.stop is not None and h2.policy.stop.kind is StopKind.FAILURE


def test_another_node_s_stall_record_waits_for_this_node_s_stacks() -> None:
    h = harness(2, stall_timeout=60.0, stacks_deadline=2.0, node_rank=1)
    h.effects.hold_stacks = True
    record = StopRecord(StopKind.STALL, "stalled (on node 0)", "stall", None, 1.0, 0.0,
                        grace=7.0, origin_node=0)
    h.policy.apply_stop(record)
    assert h.policy.stop is None and len(h.effects.captures) == 1
    h.policy.apply_stop(record)  # read again at the next poll: still one capture
    assert len(h.effects.captures) == 1
    h.effects.captures[0][2]()
    stop = h.policy.stop
    assert stop is not None and (stop.kind, stop.grace, stop.origin_node) == (StopKind.STALL,
                                                                             7.0, 0)
    other = harness(2, stacks_deadline=2.0, node_rank=1)
    other.effects.hold_stacks = True
    other.policy.apply_stop(StopRecord(StopKind.CANCEL, "cancelled (on node 0)", "operator",
                                  signal.SIGINT, 1.0, 0.0, grace=7.0, origin_node=0))
    assert other.policy.stop is not None and other.effects.captures == []  # at once


def test_this_node_s_own_stall_takes_the_agreed_record_if_it_comes_meanwhile() -> None:
    h = harness(2, stall_timeout=5.0, stacks_deadline=2.0, node_rank=1)
    h.effects.hold_stacks = True
    _stall(h)  # this node declared it too and is capturing
    h.policy.apply_stop(StopRecord(StopKind.STALL, "stalled (on node 0)", "stall", None, 1.0, 0.0,
                              grace=7.0, origin_node=0))
    h.effects.captures[0][2]()
    stop = h.policy.stop
    assert stop is not None and (stop.origin_node, stop.reason) == (0, "stalled (on node 0)")


# ---------------------------------------------------------------------- reading dumps

FAULTHANDLER = """
=== forgelm-tui: rank 0 (pid 1), ...: every thread, most recent call first, via faulthandler ===
Thread 0x00007f96d4cdc6c0 (most recent call first):
  File "/x/loader.py", line 6 in bg
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f96d583fb80 (most recent call first):
  File "/x/pkg/train.py", line 10 in spin
  File "/x/pkg/train.py", line 11 in <module>
"""
PY_SPY_DUMP = """Process 14371: python /x/train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 14373 (idle): "Thread-1 (bg)"
    bg (/x/loader.py:6)
    Thread.run (/usr/lib/python3.11/threading.py:982)
Thread 14371 (active+gil): "MainThread"
    spin (/x/pkg/train.py:10)
    <module> (/x/pkg/train.py:11)
"""


def test_the_innermost_frame_of_the_main_thread_from_either_format() -> None:
    threads = faulthandler_threads(FAULTHANDLER)
    assert [len(t.frames) for t in threads] == [2, 2]
    assert innermost(threads, 0x7F96D583FB80) == "/x/pkg/train.py:10 spin"
    assert innermost(threads, None) == "/x/pkg/train.py:10 spin"  # the oldest thread: main
    assert innermost(threads, 0x7F96D4CDC6C0) == "/x/loader.py:6 bg"
    spy = py_spy_threads(PY_SPY_DUMP)
    assert [t.name for t in spy] == ["Thread-1 (bg)", "MainThread"]
    assert innermost(spy, 14371) == innermost(spy, None) == "/x/pkg/train.py:10 spin"
    assert innermost(faulthandler_threads("Thread 0x1 (most recent call first):\n"
                                          "  <no Python frame>\n"), None) is None
    assert short_frame("/x/pkg/train.py:10 spin") == "pkg/train.py:10 spin"
    assert short_frame("<frozen runpy>:88 _run_code") == "<frozen runpy>:88 _run_code"


def test_headless_prints_one_line_per_rank() -> None:
    event = ev.StacksCaptured("stall", (
        ev.RankStacks(0, "/r/a.py:3 spin", "/run/rank-0.stacks.txt", "faulthandler"),
        ev.RankStacks(1, None, None, None, "it did not announce ...; pip install ..."),
    ), 1.0, 0.25)
    assert stacks_lines(event) == [
        "stacks of rank(s) 0,1 (stall, 0.25 s); every thread in /run/rank-N.stacks.txt",
        "rank 0 stuck at /r/a.py:3 spin",
        "rank 1: no stacks (it did not announce ...; pip install ...)",
    ]


# ---------------------------------------------------------------------- the announcement


def test_the_announcement_is_read_from_the_rank_s_own_process_only() -> None:
    record = RankRecord(0, 0, 0, "o", "e", "x")
    record.mark_started(4242)
    before = record.last_progress_mono
    message = decode(encode(0, MessageKind.STACKS_HANDLER, signum=STACKS_SIGNAL, pid=4242,
                            thread=77, file="/run/rank-0.stacks.txt"))
    assert message is not None and message.thread == 77
    reader = ProgressReader(lambda event: None)
    reader.read_message(record, message)
    assert record.stacks_handler == StacksHandler(STACKS_SIGNAL, 77, "/run/rank-0.stacks.txt")
    assert not record.channel_seen and record.last_progress_mono == before  # no progress
    other = RankRecord(1, 1, 0, "o", "e", "x")
    other.mark_started(5000)  # a child of the rank with the same RANK: not the rank
    reader.read_message(other, message)
    assert other.stacks_handler is None


RANK_PROGRAM = """
import os, sys, time
from forgelm_tui.rank import report_progress

def wait_here():
    print("ready", flush=True)  # from here: a dump from now on has this frame
    while True:
        time.sleep(3600)

report_progress(1, 10)
wait_here()
"""


def _listen(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(socket_address(name))
    sock.settimeout(20)
    return sock


def _rank_process(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp_path / "rank_program.py"
    script.write_text(RANK_PROGRAM)
    full = {**os.environ, "RANK": "3", "FORGELM_TUI_RUN_DIR": str(tmp_path), **env}
    proc = subprocess.Popen([sys.executable, str(script)], env=full, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_the_first_message_installs_and_announces_the_handler(tmp_path: Path) -> None:
    name = f"@forgelm-tui-test-stacks-{os.getpid()}"
    with _listen(name) as sock:
        proc = _rank_process(tmp_path, {CHANNEL_ENV: name, STACKS_ENV: str(STACKS_SIGNAL)})
        try:
            first, second = decode(sock.recv(8192)), decode(sock.recv(8192))
            assert first is not None and second is not None
            assert first.kind is MessageKind.STACKS_HANDLER and second.kind is MessageKind.PROGRESS
            path = tmp_path / "rank-3.stacks.txt"
            assert (first.pid, first.signum, first.file) == (proc.pid, STACKS_SIGNAL, str(path))
            os.kill(proc.pid, STACKS_SIGNAL)
            text = wait_for(lambda: "wait_here" in path.read_text() and path.read_text(), 10,
                            "the dump")
            assert innermost(faulthandler_threads(text), first.thread).endswith(" wait_here")
            assert proc.poll() is None  # the handler wrote the stacks; the rank goes on
        finally:
            proc.kill()
            proc.wait()


LATE = """
import faulthandler, os, signal, sys, time
from forgelm_tui.rank import stacks
signum = int(sys.argv[1])
assert stacks.install(lambda *a, **k: None)
faulthandler.unregister(signum)  # what the interpreter's finalization does
os.kill(os.getpid(), signum)  # a capture that comes in the rank's last moments
time.sleep(0.2)
print("alive", flush=True)
"""


def test_a_capture_in_a_ranks_last_moments_is_not_its_death(tmp_path: Path) -> None:
    """faulthandler restores the disposition it found when the interpreter finalizes: the
    runtime ignores the signal first, so a stacks signal that reaches an ending rank after
    that is ignored, not its death by SIGRTMIN+3 (a rank in teardown was blamed once as
    failed on its own)."""
    env = {**os.environ, "RANK": "3", "FORGELM_TUI_RUN_DIR": str(tmp_path),
           STACKS_ENV: str(STACKS_SIGNAL)}
    done = subprocess.run([sys.executable, "-c", LATE, str(STACKS_SIGNAL)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "alive\n"), done.stderr


FROM_A_THREAD = """
import atexit, faulthandler, os, signal, sys, threading, time
from forgelm_tui.rank import stacks
signum = int(sys.argv[1])
got = []
thread = threading.Thread(target=lambda: got.append(stacks.install(lambda *a, **k: None)))
thread.start()
thread.join()
print(got, os.path.exists(os.path.join(os.environ["FORGELM_TUI_RUN_DIR"], "rank-3.stacks.txt")),
      flush=True)
atexit._run_exitfuncs()  # what the interpreter's exit does first, in the main thread
faulthandler.unregister(signum)  # then faulthandler's end
os.kill(os.getpid(), signum)  # a capture that comes in the rank's last moments
time.sleep(0.2)
print("alive", flush=True)
"""


def test_the_handler_is_installed_from_another_thread_too(tmp_path: Path) -> None:
    """The first channel message of a plain script under the collectives watcher comes from the
    watcher's thread: the handler goes in from there (Python sets the ignored disposition
    from the main thread only; a review found the install refused there for a while), and
    the main thread ignores the signal at exit: a late capture is not the rank's death."""
    env = {**os.environ, "RANK": "3", "FORGELM_TUI_RUN_DIR": str(tmp_path),
           STACKS_ENV: str(STACKS_SIGNAL)}
    done = subprocess.run([sys.executable, "-c", FROM_A_THREAD, str(STACKS_SIGNAL)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "[True] True\nalive\n"), done.stderr


def test_no_handler_without_the_supervisor_asking(tmp_path: Path) -> None:
    """An older supervisor names no stacks signal: no handler, no announcement (it would count
    an unknown kind as a heartbeat), and the signal keeps its default action."""
    name = f"@forgelm-tui-test-nostacks-{os.getpid()}"
    with _listen(name) as sock:
        proc = _rank_process(tmp_path, {CHANNEL_ENV: name})
        try:
            first = decode(sock.recv(8192))
            assert first is not None and first.kind is MessageKind.PROGRESS
            assert not (tmp_path / "rank-3.stacks.txt").exists()
        finally:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------- the capture, in-process

IGNORING = """
import signal, sys, time
signal.signal(int(sys.argv[1]), signal.SIG_IGN)
def wait_here():
    print("ready", flush=True)
    while True:
        time.sleep(3600)
wait_here()
"""


def _target(tmp_path: Path, code: str, *args: str) -> tuple[subprocess.Popen[str], RankRecord]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    record = RankRecord(0, 0, 0, "o", "e", "x")
    record.mark_started(proc.pid)
    return proc, record


def _capture(tmp_path: Path, record: RankRecord, py_spy: str | None,
             deadline: float) -> tuple[ev.StacksCaptured, float, list[str]]:
    sent: list[str] = []

    def signal_rank(target: RankRecord, reason: str) -> bool:
        assert target.pid is not None
        os.kill(target.pid, STACKS_SIGNAL)
        sent.append(reason)
        return True

    capture = StackCapture(tmp_path, signal_rank, lambda event: None, deadline=deadline,
                           py_spy=py_spy)
    began = time.monotonic()
    result = asyncio.run(capture.capture([record], "test"))
    return result, time.monotonic() - began, sent


def test_the_deadline_holds_when_a_rank_ignores_the_signal(tmp_path: Path) -> None:
    proc, record = _target(tmp_path, IGNORING, str(STACKS_SIGNAL))
    record.stacks_handler = StacksHandler(STACKS_SIGNAL, None, str(tmp_path / "rank-0.stacks.txt"))
    try:
        result, took, sent = _capture(tmp_path, record, None, deadline=1.0)
        assert took <= 1.0 + 0.3, took
        assert sent == ["where is it stuck (test)"]
        (stacks,) = result.ranks
        assert stacks.stuck_at is None and stacks.via is None
        assert "wrote nothing in time" in (stacks.note or "")
        assert "forgelm-tui[stacks]" in (stacks.note or "")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def _fake_py_spy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


PLAIN = """
import time
def wait_here():
    print("ready", flush=True)
    while True:
        time.sleep(3600)
wait_here()
"""


def test_py_spy_not_permitted_and_too_slow_are_notes(tmp_path: Path) -> None:
    proc, record = _target(tmp_path, PLAIN)
    try:
        denied = _fake_py_spy(tmp_path, "echo 'Error: Permission Denied: Try running again "
                                        "with elevated permissions' >&2; exit 1")
        result, _, sent = _capture(tmp_path, record, denied, deadline=2.0)
        assert sent == []  # it did not announce the handler: never signalled
        note = result.ranks[0].note or ""
        assert "did not announce" in note and "not permitted" in note and "ptrace" in note
        slow = _fake_py_spy(tmp_path, "exec sleep 30")
        result, took, _ = _capture(tmp_path, record, slow, deadline=1.0)
        assert took <= 1.0 + 0.3, took
        # py-spy's own timer ran out, or (a loaded machine) the capture's deadline came first
        assert result.ranks[0].stuck_at is None and "in time" in (result.ranks[0].note or "")
        assert "py-spy" in (result.ranks[0].note or "")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed (the [stacks] extra)")
def test_py_spy_reads_a_rank_without_the_handler(tmp_path: Path) -> None:
    proc, record = _target(tmp_path, PLAIN)
    try:
        result, took, sent = _capture(tmp_path, record, PY_SPY, deadline=2.0)
        (stacks,) = result.ranks
        assert sent == [] and stacks.via == "py-spy", stacks
        assert stacks.stuck_at is not None and stacks.stuck_at.endswith(" wait_here")
        assert f"Thread {proc.pid} " in (tmp_path / "rank-0.stacks.txt").read_text()
        assert took <= 2.0
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------- real runs, the CLI


def _ranks(envelope: dict[str, Any]) -> list[dict[str, Any]]:
    return list(envelope["ranks"])


def _stacks_signals(rank: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in rank["signals_sent"] if s["purpose"] == "stacks"]


@pytest.mark.fault("F09")
def test_the_spinning_rank_case_ends_as_a_stall_with_both_ranks_stacks(tmp_path: Path,
                                                                      marks: Path) -> None:
    """Issue 13: steps 1-5, then rank 0 spins a core and rank 1 sleeps."""
    run = start(["--nproc-per-node", "2", "--stall-timeout", "2", "--grace", "2",
                 rank_script("evidence.py"), "spin", str(marks)], tmp_path)
    assert run.wait(40) == 2
    after = time.time() - float((marks / "steps-0").read_text())
    assert after <= 2 + 2 + 2, after
    envelope = run.envelope()
    assert envelope["stop"]["kind"] == "stall" and envelope["exit_code"] == 2
    assert envelope["stop"]["stacks_delay_s"] <= 2.0
    for rank in _ranks(envelope):
        path = Path(rank["stacks_file"])
        assert path == run.run_dir / f"rank-{rank['rank']}.stacks.txt" and path.exists()
        assert rank["stacks_via"] == "faulthandler" and rank["stacks_note"] is None
        assert [s["signal"] for s in _stacks_signals(rank)] == [RESERVED]
    rank0, rank1 = _ranks(envelope)
    assert rank0["stuck_at"].endswith("evidence.py:" + rank0["stuck_at"].split(":")[-1])
    assert rank0["stuck_at"].split(" ")[-1] == "spin"  # the busy loop
    assert rank1["stuck_at"].split(" ")[-1] == "<module>"  # its sleep at the top level
    assert rank0["signal"] == "SIGTERM"  # then stopped as before
    out, _ = run.output()
    assert f"rank 0 stuck at {rank0['stuck_at']}" in out


def test_a_rank_without_the_handler_or_ignoring_the_signal_within_the_deadline(
        tmp_path: Path, marks: Path) -> None:
    """Rank 0 has the handler; rank 1 none (it never gets the reserved signal: py-spy reads
    it, or a note says why not); rank 2 ignores the signal (the capture's deadline holds)."""
    run = run_cli(["--nproc-per-node", "3", "--stall-timeout", "2", "--grace", "2",
                   rank_script("stuck.py"), str(marks), "helpers", "plain", "ignore"], tmp_path)
    assert run.proc.returncode == 2
    envelope = run.envelope()
    assert envelope["stop"]["kind"] == "stall"
    assert envelope["stop"]["stacks_delay_s"] <= 2.0 + 0.1
    helpers, plain, ignoring = _ranks(envelope)
    assert helpers["stuck_at"].split(" ")[-1] == "wait_here"
    assert helpers["stacks_via"] == "faulthandler"
    assert _stacks_signals(plain) == [] and plain["signal"] == "SIGTERM"  # the stop's, only
    if PY_SPY is not None:
        assert plain["stacks_via"] == "py-spy" and plain["stuck_at"].endswith(" wait_here")
    else:
        assert plain["stuck_at"] is None and "did not announce" in plain["stacks_note"]
    assert [s["signal"] for s in _stacks_signals(ignoring)] == [RESERVED]
    assert "wrote nothing in time" in ignoring["stacks_note"]
    assert ignoring["signal"] == "SIGTERM"  # it ignored the stacks signal, not the stop


@pytest.mark.fault("F24")
def test_sigquit_to_the_supervisor_captures_the_stacks_and_the_run_goes_on(
        tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", "--stall-timeout", "30", rank_script("stuck.py"),
                 str(marks), "beat", "beat"], tmp_path)
    ready_pids(marks, 2)
    run.signal(signal.SIGQUIT)
    files = [run.run_dir / f"rank-{r}.stacks.txt" for r in range(2)]
    wait_for(lambda: all(f.exists() and "in beating" in f.read_text() for f in files), 20,
             "both ranks' stacks")
    time.sleep(0.5)
    assert run.proc.poll() is None  # the supervisor and the ranks go on
    run.signal(signal.SIGINT)
    assert run.wait(30) == 2
    envelope = run.envelope()
    assert envelope["stop"]["kind"] == "cancel" and envelope["stop"]["stacks_delay_s"] is None
    for rank in _ranks(envelope):
        assert rank["stuck_at"] is not None and rank["stacks_via"] == "faulthandler"
        assert _stacks_signals(rank)[0]["reason"] == (
            "where is it stuck (requested by SIGQUIT to the supervisor)")
    out, _ = run.output()
    assert "stacks of rank(s) 0,1 (requested by SIGQUIT to the supervisor" in out


def test_the_reserved_signal_cannot_be_forwarded(tmp_path: Path) -> None:
    run = run_cli(["--forward-signals", f"SIGUSR1,{RESERVED}", "demo"], tmp_path)
    assert run.proc.returncode == 1
    _, err = run.output()
    assert f"{RESERVED} is reserved for capturing the ranks' stacks" in err


def test_the_envelope_names_where_each_rank_was_stuck(tmp_path: Path) -> None:
    from forgelm_tui.envelope.entries import rank_entry

    record = RankRecord(0, 0, 0, "o", "e", "x")
    record.stacks = ev.RankStacks(0, "/a.py:1 f", "/run/rank-0.stacks.txt", "faulthandler")
    fields = rank_entry(record, None)
    assert {k: fields[k] for k in ("stuck_at", "stacks_file", "stacks_via", "stacks_note")} == {
        "stuck_at": "/a.py:1 f", "stacks_file": "/run/rank-0.stacks.txt",
        "stacks_via": "faulthandler", "stacks_note": None}
    json.dumps(fields)
    assert Purpose.STACKS.value == "stacks" and not Purpose.STACKS.stops


@pytest.mark.timeout(90)
def test_every_node_captures_its_ranks_stacks_before_a_stall_stop(tmp_path: Path,
                                                                  marks: Path) -> None:
    """No rank on any node progresses: a stall, 2 everywhere. Node 1 has no stall timeout of
    its own: the stall is node 0's (its rank's age and node 1's, from node 1's beats), and
    node 1 captures its rank's stacks when the stop record arrives, before it applies the
    stop."""
    from cluster_nodes import no_orphans, same_envelopes, start_nodes, wait_all

    nodes = start_nodes(2, [rank_script("stuck.py"), str(marks), "helpers", "helpers"], tmp_path,
                        extra=[["--stall-timeout", "2"], []], common=["--grace", "2"])
    assert wait_all(nodes, 80) == [2, 2]
    envelope = same_envelopes(nodes)  # both nodes' ranks, the same verdict on both nodes
    assert envelope["stop"]["kind"] == "stall" and envelope["stop"]["origin_node"] == 0
    assert envelope["decided_by"]["rule"] == 4
    no_orphans([p for n in nodes for p in n.rank_pids()])
    for rank in _ranks(envelope):
        node_dir = tmp_path / "run" / f"node-{rank['rank']}"
        assert rank["stacks_file"] == str(node_dir / f"rank-{rank['rank']}.stacks.txt")
        assert rank["stuck_at"].split(" ")[-1] == "wait_here"
        purposes = [s["purpose"] for s in rank["signals_sent"]]
        assert purposes[:2] == ["stacks", "stop"], purposes  # the stacks first, then the stop
