"""`forgelm-tui attach` and `ls` (SPEC §9): the TUI on a run started elsewhere, in tmux."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, rank_script, ready_pids, start, wait_for
from tmux_terminal import Terminal

pytestmark = pytest.mark.timeout(120)

SLEEPER = rank_script("sleeper.py")



def headless(tmp_path: Path, marks: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    run = start(["--nproc-per-node", "2", *extra, SLEEPER, str(marks)], tmp_path)
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
    screen = term.wait_screen(r"RUNNING")
    assert "rank 0 ready" in screen and "rank 1 ready" in screen  # the logs so far, from files
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


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forgelm_tui", *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=60)


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
