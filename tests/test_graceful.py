"""The graceful runner: SIGTERM becomes an exception; nothing else about the program changes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import RANKS, rank_script, start, wait_for

pytestmark = pytest.mark.timeout(60)


def _run(args: list[str], cwd: Path) -> tuple[int, dict[str, object]]:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=30)
    return proc.returncode, json.loads(proc.stdout)


def test_script_sees_what_plain_python_gives(tmp_path: Path) -> None:
    script = rank_script("probe.py")
    plain = _run([script, "3", "x"], tmp_path)
    wrapped = _run(["-m", "forgelm_tui.rank.graceful", script, "3", "x"], tmp_path)
    assert wrapped == plain
    assert plain[0] == 3 and plain[1]["name"] == "__main__"


def test_module_sees_what_python_m_gives(tmp_path: Path) -> None:
    plain = _run(["-m", "pkg_probe", "4", "--flag"], RANKS)
    wrapped = _run(["-m", "forgelm_tui.rank.graceful", "-m", "pkg_probe", "4", "--flag"], RANKS)
    assert wrapped == plain
    assert plain[0] == 4 and plain[1]["name"] == "__main__"


def test_sigterm_runs_the_programs_cleanup(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", "--graceful", rank_script("cleanup_on_term.py"),
                 str(marks)], tmp_path)
    ready_pids_or_files(marks)
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    for rank in range(2):
        assert (marks / f"caught-{rank}").read_text() == "GracefulStop: stopped by SIGTERM"
        assert (marks / f"finally-{rank}").exists()
    envelope = run.envelope()
    assert envelope["settings"]["graceful"] is True
    assert [r["exit_code"] for r in envelope["ranks"]] == [2, 2]
    assert "forgelm_tui.rank.graceful" in envelope["rank_command"]


def test_without_graceful_sigterm_kills_at_once(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "1", rank_script("cleanup_on_term.py"), str(marks)],
                tmp_path)
    ready_pids_or_files(marks, 1)
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    assert not (marks / "caught-0").exists() and not (marks / "finally-0").exists()
    assert run.envelope()["ranks"][0]["signal"] == "SIGTERM"


def test_uncaught_stop_dies_of_sigterm_as_without_the_runner(tmp_path: Path) -> None:
    missing = subprocess.run([sys.executable, "-m", "forgelm_tui.rank.graceful", "nope.py"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=30)
    plain = subprocess.run([sys.executable, "nope.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=30)
    assert (missing.returncode, missing.stderr) == (plain.returncode, plain.stderr)
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "forgelm_tui.rank.graceful", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert b"Traceback" not in err


def ready_pids_or_files(marks: Path, ranks: int = 2) -> None:
    wait_for(lambda: all((marks / f"ready-{r}").exists() for r in range(ranks)), 30,
             "ranks to be ready")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("held", ["plain", "ddp"])
def test_a_stopped_gloo_rank_frees_the_peer_waiting_on_it(tmp_path: Path, marks: Path,
                                                          held: str) -> None:
    """Rank 1 stops first: it leaves the process group, so rank 0, waiting in an all_reduce rank
    1 will never enter, fails at once into its own cleanup, not when rank 1's process ends
    (after its cleanup: a hang until the grace's SIGKILL). Rank 0's own SIGTERM then comes in
    the middle of that cleanup and is raised only after it, in the loop. With a DDP model
    holding the group (``ddp``: destroying it closes nothing), rank 1 shuts its connections
    down itself."""
    run = start(["--nproc-per-node", "2", "--graceful", rank_script("peer_left.py"),
                 str(marks)] + (["ddp"] if held == "ddp" else []), tmp_path)
    pids = [int(p) for p in wait_for(
        lambda: [(marks / f"ready-{r}").read_text() for r in range(2)]
        if all((marks / f"ready-{r}").exists() for r in range(2)) else None,
        60, "both ranks ready")]
    os.kill(pids[1], signal.SIGTERM)
    wait_for(lambda: (marks / "caught-0").exists() and (marks / "stopped-1").exists(), 30,
             "rank 0's collective to fail while rank 1 is in its cleanup")
    caught = (marks / "caught-0").read_text()  # rank 1 still runs: it left the group
    assert "Connection closed" in caught or "Connection reset" in caught, caught  # FIN or RST
    assert (marks / "stopped-1").read_text() == "GracefulStop: stopped by SIGTERM"
    os.kill(pids[0], signal.SIGTERM)  # rank 0 is in its cleanup, waiting for the release
    time.sleep(0.3)  # long enough for a wrongly raised stop to land in that cleanup (3 re-checks)
    assert not (marks / "stopped-0").exists()
    (marks / "release").write_text("")
    assert run.wait(60) == 2
    for rank in range(2):
        assert (marks / f"cleanup-{rank}").read_text() == "done", rank
    assert (marks / "stopped-0").read_text() == "GracefulStop: stopped by SIGTERM"
    # whichever ends first, its exit 2 begins a stop whose SIGTERM finds the other in its
    # cleanup (the same request) or in its teardown (ignored): both keep their own exit code
    assert [r["exit_code"] for r in run.envelope()["ranks"]] == [2, 2]



def test_a_later_sigterm_never_ends_a_cleanup_under_way(tmp_path: Path) -> None:
    """After the first SIGTERM every other is the same request, whenever it comes: the
    supervisor's own copy seconds late on a loaded node, preemption's second SIGTERM GraceTime
    later (slurmstepd signals every process of the step under linuxproc). The cleanup runs to
    its end; only the grace's SIGKILL could cut it."""
    script = tmp_path / "slow_cleanup.py"
    script.write_text(
        "import os, sys, time\n"
        "marks = sys.argv[1]\n"
        "try:  # ready inside the try: a SIGTERM right after the mark is caught\n"
        "    open(os.path.join(marks, 'ready'), 'w').close()\n"
        "    while True:\n"
        "        time.sleep(0.02)\n"
        "except Exception:\n"
        "    open(os.path.join(marks, 'caught'), 'w').close()\n"
        "    while not os.path.exists(os.path.join(marks, 'release')):\n"
        "        time.sleep(0.02)\n"
        "    open(os.path.join(marks, 'cleanup'), 'w').write('done')\n"
        "    sys.exit(2)\n")
    proc = subprocess.Popen([sys.executable, "-m", "forgelm_tui.rank.graceful", str(script),
                             str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for((tmp_path / "ready").exists, 30, "the program to be ready")
        first = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_for((tmp_path / "caught").exists, 30, "the stop to be raised")
        wait_for(lambda: time.monotonic() > first + 1.5, 5, "1.5 s after the first SIGTERM")
        for _ in range(2):
            proc.send_signal(signal.SIGTERM)
        (tmp_path / "release").write_text("")
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err
    assert (tmp_path / "cleanup").read_text() == "done"
