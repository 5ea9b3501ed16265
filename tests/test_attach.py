"""`forgelm-tui attach` and `ls` (SPEC §9): the TUI on a run started elsewhere, in tmux."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import cli_env, rank_script, ready_pids, start, wait_for
from tmux_terminal import Terminal

pytestmark = pytest.mark.timeout(120)

SLEEPER = rank_script("sleeper.py")


def headless(tmp_path: Path, marks: Path, *extra: str,
             env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Path]:
    run = start(["--nproc-per-node", "2", *extra, SLEEPER, str(marks)], tmp_path, env=env)
    ready_pids(marks, 2)
    wait_for((run.run_dir / "control.sock").exists, 30, "the control socket")
    return run.proc, run.run_dir


def run_id(run_dir: Path) -> str:
    from forgelm_tui.control.client import ControlClient

    client = ControlClient(run_dir / "control.sock")  # its hello names the run
    client.close()
    return client.run_id


def test_attach_cancel_from_the_viewer(term: Terminal, tmp_path: Path, marks: Path) -> None:
    proc, run_dir = headless(tmp_path, marks)
    term.start(["attach", str(run_dir)], raw=True)
    # the whole first screen, not its header alone (a frame can show the header first)
    screen = term.wait_screen(r"(?s)(?=.*rank 0 ready)(?=.*rank 1 ready).*RUNNING")
    assert "rank 0 ready" in screen and "rank 1 ready" in screen  # the logs so far, from files
    assert re.search(r"^ forgelm-tui --no-tui ", screen, re.M)  # the command, as the run's own
    term.press("c")
    term.wait_screen(r"Stop the run\?")
    term.press("y")
    assert proc.wait(30) == 2
    term.wait_screen(r"FINISHED.*exit 2 TRAINING_ERROR")
    term.press("q")
    assert term.exit_code() == 2
    envelope = json.loads((run_dir / "envelope.json").read_text())
    cancel = envelope["cancel_requests"][0]
    assert cancel["source"] == "viewer" and cancel["by"].startswith("attached viewer (pid ")


def test_detach_and_attach_again(term: Terminal, tmp_path: Path, marks: Path) -> None:
    proc, run_dir = headless(tmp_path, marks)
    term.start(["attach", str(run_dir)], raw=True)
    term.wait_screen(r"RUNNING")
    term.press("d")
    assert term.exit_code() == 0
    term.wait_screen(r"detached from run .* it goes on")
    assert proc.poll() is None  # the run goes on
    again = Terminal(tmp_path / "again")
    (tmp_path / "again").mkdir()
    try:
        again.start(["attach", run_id(run_dir)], raw=True)  # by run id, from the registry
        again.wait_screen(r"RUNNING")
        proc.send_signal(signal.SIGTERM)
        again.wait_screen(r"FINISHED.*exit 2 TRAINING_ERROR")
        assert proc.wait(30) == 2
        again.press("q")
        assert again.exit_code() == 2
    finally:
        again.close()


def cli(args: list[str], cwd: Path,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forgelm_tui", *args], cwd=cwd,
                          env=cli_env(env), capture_output=True, text=True, timeout=60)


def test_attach_errors_are_one_line(tmp_path: Path) -> None:
    done = cli(["attach", "no-such-run-id"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "forgelm-tui attach: no-such-run-id: no such run (forgelm-tui ls lists the runs it "
        "knows)"]
    assert not (tmp_path / "forgelm-tui-runs").exists()  # no run dir, no envelope
    done = cli(["attach", str(tmp_path)], tmp_path)
    assert done.returncode == 1 and "not a forgelm-tui run dir" in done.stderr
    done = cli(["attach", "--bogus"], tmp_path)
    assert done.returncode == 1 and "unrecognized arguments" in done.stderr
    done = cli(["attach", "--nice", "20", "no-such-run-id"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "forgelm-tui attach: --nice must be a whole number 0..19, got 20"]


def test_ls_and_attach_to_an_ended_run(tmp_path: Path, marks: Path) -> None:
    proc, run_dir = headless(tmp_path, marks)
    rid = run_id(run_dir)
    listed = cli(["ls"], tmp_path)
    assert listed.returncode == 0
    line = next(x for x in listed.stdout.splitlines() if x.startswith(rid))
    assert " running " in line
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 2
    line = next(x for x in cli(["ls"], tmp_path).stdout.splitlines() if x.startswith(rid))
    assert " ended " in line and " 2 " in line
    ended = cli(["attach", str(run_dir)], tmp_path)
    assert ended.returncode == 2
    assert "has ended: exit 2 EXIT_TRAINING_ERROR" in ended.stderr


def own_state(tmp_path: Path) -> dict[str, str]:
    """A registry of this test's own (xdist workers share the session's)."""
    return {"XDG_STATE_HOME": str(tmp_path / "state")}


def registry_entry(tmp_path: Path) -> Path:
    runs = tmp_path / "state" / "forgelm-tui" / "runs"
    return wait_for(lambda: next(iter(runs.glob("*.json")), None), 30, "the registry entry")


def test_attach_with_no_argument_finds_the_latest_run(term: Terminal, tmp_path: Path,
                                                      marks: Path) -> None:
    """`forgelm-tui attach`: the newest live run; its key line offers d; t asks the run for
    every rank's stacks."""
    proc, run_dir = headless(tmp_path, marks, env=own_state(tmp_path))
    pids = ready_pids(marks, 2)
    term.start(["attach"], raw=True, env=own_state(tmp_path))
    term.wait_screen(r"RUNNING")
    # (the table and the key line may come a frame after the header on a loaded machine)
    wait_for(lambda: all(str(pid) in term.screen() for pid in pids), 30, "the ranks' pids")
    term.wait_screen(r"c Cancel\s+k Kill now\s+d Detach", 30)
    term.press("t")
    term.wait_screen(r"Stacks \(")  # the run's StacksCaptured, requested through the socket
    stacks = (run_dir / "rank-0.stacks.txt").read_text()
    viewer = re.search(r"requested by attached viewer \(pid (\d+),", stacks)
    assert viewer is not None
    stat = Path(f"/proc/{viewer.group(1)}/stat").read_text()
    assert int(stat.rsplit(")", 1)[1].split()[16]) == 10  # nice: the viewer yields the CPU
    term.press("d")
    assert term.exit_code() == 0
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 2


class Proxy:
    """A Unix socket between a viewer and the run, whose connections the test can cut."""

    def __init__(self, path: Path, upstream: Path) -> None:
        self.path, self.upstream = path, upstream
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        self.accepted = 0
        self.live: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(str(self.upstream))
            self.live += [down, up]
            self.accepted += 1
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        for sock in self.live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.live = []

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_a_dropped_connection_is_made_again(term: Terminal, tmp_path: Path,
                                            marks: Path) -> None:
    """The connection drops mid-run (not a detach, not the run's end): the viewer reconnects,
    gets a fresh snapshot, and its commands reach the run again."""
    proc, run_dir = headless(tmp_path, marks, env=own_state(tmp_path))
    entry = registry_entry(tmp_path)
    known = json.loads(entry.read_text())
    proxy = Proxy(tmp_path / "proxy.sock", Path(known["socket"]))
    try:
        entry.write_text(json.dumps({**known, "socket": str(proxy.path)}))
        term.start(["attach", known["run_id"]], raw=True, env=own_state(tmp_path))
        term.wait_screen(r"RUNNING")
        assert proxy.accepted == 1
        proxy.cut()
        wait_for(lambda: proxy.accepted == 2, 20, "the viewer to connect again")
        term.wait_screen(r"Reconnected")
        term.press("c")
        term.wait_screen(r"Stop the run\?")
        term.press("y")
        assert proc.wait(30) == 2
        term.wait_screen(r"FINISHED.*exit 2 TRAINING_ERROR")
        term.press("q")
        assert term.exit_code() == 2
    finally:
        proxy.close()
    cancel = json.loads((run_dir / "envelope.json").read_text())["cancel_requests"][0]
    assert cancel["source"] == "viewer"


def test_attaching_as_the_run_ends_shows_its_verdict(term: Terminal, tmp_path: Path) -> None:
    """The socket went between finding the run and connecting, or the connection closed before
    the snapshot: the finished run's verdict, not an error."""
    run = start(["--nproc-per-node", "1", rank_script("exit_with.py"), "3"], tmp_path,
                env=own_state(tmp_path))
    assert run.wait(60) == 3
    dead = tmp_path / "dead.sock"  # a socket file nobody listens on
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(dead))
    closing = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # closes before any hello
    closing.bind(str(tmp_path / "closing.sock"))
    closing.listen()

    def close_each() -> None:
        with contextlib.suppress(OSError):
            while True:
                closing.accept()[0].close()

    threading.Thread(target=close_each, daemon=True).start()
    runs = tmp_path / "state" / "forgelm-tui" / "runs"
    for name, path in (("racing-dead", dead), ("racing-closing", tmp_path / "closing.sock")):
        run_dir = tmp_path / name  # a run dir of its own (the registry knows a run dir once)
        run_dir.mkdir()
        ended = {**run.envelope(), "run_id": name}  # this run's envelope (another's is not)
        (run_dir / "envelope.json").write_text(json.dumps(ended))
        (runs / f"{name}.json").write_text(json.dumps({
            "run_id": name, "run_dir": str(run_dir), "socket": str(path),
            "pid": os.getpid(), "started_at": time.time()}))  # a live "supervisor": this test
    try:
        for name in ("racing-dead", "racing-closing"):
            done = cli(["attach", name], tmp_path, own_state(tmp_path))
            assert done.returncode == 3, done.stderr
            assert "has ended: exit 3 EXIT_EVAL_FAILURE" in done.stderr
        term.start(["attach", "racing-closing", "--via", "browser"], raw=True,
                   env=own_state(tmp_path))
        term.wait_screen(r"FINISHED.*run racing-closing")  # the finished run's view (EndedApp)
        term.press("q")
        assert term.exit_code() == 3
    finally:
        closing.close()
