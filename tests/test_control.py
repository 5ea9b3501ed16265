"""Attach's run side (SPEC §9): every run serves a snapshot, then its events, on a 0600 Unix
socket, and takes commands recorded with who sent them; no viewer can slow or stop the run."""

from __future__ import annotations

import os
import signal
import socket
import stat
import time
from pathlib import Path

import pytest
from conftest import rank_script, ready_pids, run_cli, start, wait_for

from forgelm_tui.control.client import ControlClient, ControlError
from forgelm_tui.engine import events as ev

pytestmark = pytest.mark.timeout(90)

SLEEPER = rank_script("sleeper.py")


def connect(run_dir: Path) -> ControlClient:
    sock = run_dir / "control.sock"
    wait_for(sock.exists, 30, "the control socket")
    return ControlClient(sock)


def state_env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "rt")}


def until_verdict(client: ControlClient) -> list[object]:
    items: list[object] = []
    while not any(isinstance(i, ev.VerdictReached) for i in items):
        items.append(client.next_item())
    return items


def test_snapshot_events_and_a_cancel_from_a_viewer(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", SLEEPER, str(marks)], tmp_path, env=state_env(tmp_path))
    ready_pids(marks, 2)
    client = connect(run.run_dir)
    assert stat.S_IMODE((run.run_dir / "control.sock").stat().st_mode) == 0o600
    snapshot = client.next_item()
    assert isinstance(snapshot, ev.RunSnapshot)
    assert [r.rank for r in snapshot.ranks] == [0, 1] and all(r.pid for r in snapshot.ranks)
    client.send("forward", signal="SIGUSR1")
    wait_for(lambda: all((marks / f"got-SIGUSR1-{r}").exists() for r in range(2)), 20,
             "SIGUSR1 at both ranks")
    client.send("cancel")
    items = until_verdict(client)
    acks = [i for i in items if isinstance(i, dict) and i.get("type") == "ack"]
    assert acks == [{"type": "ack", "command": "forward", "effect": "forwarded SIGUSR1"},
                    {"type": "ack", "command": "cancel", "effect": "stop"}]
    assert any(isinstance(i, ev.RunStopping) for i in items)
    assert run.wait(30) == 2
    cancel = run.envelope()["cancel_requests"][0]
    assert cancel["source"] == "viewer"
    assert cancel["by"] == f"attached viewer (pid {os.getpid()}, uid {os.getuid()}, terminal)"
    forward = run.envelope()["forwarded_signals"][0]
    assert forward["signal"] == "SIGUSR1" and forward["source"] == "viewer"
    assert forward["by"] == cancel["by"] and forward["ranks"] == [0, 1]
    client.close()
    assert not (run.run_dir / "control.sock").exists()  # gone with the run


def test_two_viewers_and_one_killed_mid_stream(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", SLEEPER, str(marks)], tmp_path, env=state_env(tmp_path))
    ready_pids(marks, 2)
    first, second, dropped = (connect(run.run_dir) for _ in range(3))
    dropped.sock.shutdown(socket.SHUT_RDWR)  # a viewer that dies abruptly
    dropped.close()
    for client in (first, second):
        assert isinstance(client.next_item(), ev.RunSnapshot)
    run.signal(signal.SIGTERM)
    first_items, second_items = until_verdict(first), until_verdict(second)
    assert [type(i) for i in first_items if not isinstance(i, ev.RankSampled)] == \
        [type(i) for i in second_items if not isinstance(i, ev.RankSampled)]
    assert run.wait(30) == 2


def test_a_viewer_that_never_reads_does_not_slow_the_run(tmp_path: Path) -> None:
    """A flood of output with a viewer that reads nothing: the run ends as without it."""
    env = state_env(tmp_path)
    run = start(["--nproc-per-node", "2", rank_script("flood.py"), "300000"], tmp_path, env=env)
    stuck = connect(run.run_dir)  # reads its hello only, then nothing
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    t0 = time.monotonic()
    assert run.wait(60) == 0
    assert time.monotonic() - t0 < 50
    log = (run.run_dir / "rank-1.stdout.log").read_bytes()
    assert log.count(b"\n") == 300000  # nothing lost
    stuck.close()


def test_a_run_dir_too_deep_for_a_socket_path(tmp_path: Path, marks: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    env = state_env(tmp_path)
    run = start(["--nproc-per-node", "1", SLEEPER, str(marks)], deep, env=env)
    ready_pids(marks, 1)
    entries = wait_for(lambda: list((tmp_path / "state" / "forgelm-tui" / "runs").glob("*.json")),
                       30, "the registry entry")
    import json

    entry = json.loads(entries[0].read_text())
    assert entry["run_dir"] == str(run.run_dir)
    path = Path(entry["socket"])
    assert len(str(path)) <= 107 and path.name.endswith(".sock")
    client = ControlClient(path)
    assert isinstance(client.next_item(), ev.RunSnapshot)
    client.send("kill")
    assert run.wait(30) == 2
    assert run.envelope()["cancel_requests"][0]["effect"] == "kill"
    client.close()


def test_nothing_listens_on_a_finished_run(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "1", rank_script("exit_with.py"), "0"], tmp_path,
                  env=state_env(tmp_path))
    assert run.proc.returncode == 0
    with pytest.raises(ControlError, match="no run answers"):
        ControlClient(run.run_dir / "control.sock")
