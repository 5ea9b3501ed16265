"""--max-restarts: the whole rank group restarted after a failure a restart can fix, never after
an outcome, a config error or a cancel; every attempt in the envelope, every attempt's logs kept.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_env, rank_script, run_cli, start, wait_for

pytestmark = pytest.mark.timeout(60)

CRASH = rank_script("crash_once.py")
FAST = ["--restart-backoff", "0.2", "--grace", "5"]


def _attempts(envelope: dict[str, Any]) -> list[tuple[int, int]]:
    return [(a["attempt"], a["exit_code"]) for a in envelope["attempts"]]


@pytest.mark.fault("F21")
def test_a_crash_once_is_restarted_and_the_run_succeeds(tmp_path: Path, marks: Path) -> None:
    run = run_cli(["--max-restarts", "2", "--nproc-per-node", "2", CRASH, str(marks), "1",
                   "signal:11"], tmp_path)
    out, _ = run.output()
    assert run.proc.returncode == 0
    envelope = run.envelope()
    assert envelope["exit_code"] == 0 and envelope["restart_count"] == 1
    assert _attempts(envelope) == [(0, 2), (1, 0)]
    first, second = envelope["attempts"]
    assert first["restart"] == {"restarted": True, "backoff_s": 1.0,
                                "why": "restarting after rank 1 failed (killed by SIGSEGV)"}
    assert first["ranks"][1]["signal"] == "SIGSEGV"
    assert second["restart"]["restarted"] is False
    assert envelope["ranks"] == second["ranks"]  # the top-level ranks are the last attempt's
    assert (envelope["run_dir"], first["run_dir"], second["run_dir"]) == (
        str(run.run_dir), str(run.run_dir), str(run.run_dir / "attempt-1"))
    # Every attempt's logs kept: the first where they always were, the next in attempt-1/.
    for rank in range(2):
        assert (run.run_dir / f"rank-{rank}.stdout.log").read_text() == f"rank {rank} attempt 0\n"
        assert (run.run_dir / "attempt-1" / f"rank-{rank}.stdout.log").read_text() == (
            f"rank {rank} attempt 1\n")
        assert second["ranks"][rank]["stdout_log"] == str(
            run.run_dir / "attempt-1" / f"rank-{rank}.stdout.log")
        # torchrun's variables, as a restarted worker sees them
        assert (marks / f"env-{rank}-0").read_text() == "2"
        assert (marks / f"env-{rank}-1").read_text() == "2"
    assert "attempt 2/3: restarting after rank 1 failed (killed by SIGSEGV); starting in 1 s" \
        in out


@pytest.mark.fault("F21")
def test_an_outcome_or_config_error_is_never_restarted(tmp_path: Path) -> None:
    """Codes 1, 3, 4, 5, 6: one run each, all at once (they share nothing)."""
    runs = {}
    for code in (1, 3, 4, 5, 6):
        marks = tmp_path / str(code) / "marks"
        marks.mkdir(parents=True)
        runs[code] = (start(["--max-restarts", "2", *FAST, "--nproc-per-node", "2", CRASH,
                             str(marks), "0", f"exit:{code}", "always"], tmp_path / str(code)),
                      marks)
    for code, (run, marks) in runs.items():
        assert run.wait(60) == code
        envelope = run.envelope()
        assert _attempts(envelope) == [(0, code)]
        assert envelope["attempts"][0]["restart"]["restarted"] is False
        assert not (run.run_dir / "attempt-1").exists()
        assert (marks / "crashes").read_text() == "1"


@pytest.mark.fault("F21")
def test_a_rank_that_crashes_every_time_uses_every_restart(tmp_path: Path, marks: Path) -> None:
    run = run_cli(["--max-restarts", "2", *FAST, "--nproc-per-node", "2", CRASH, str(marks),
                   "1", "exit:7", "always"], tmp_path)
    out, _ = run.output()
    assert run.proc.returncode == 2
    envelope = run.envelope()
    assert _attempts(envelope) == [(0, 2), (1, 2), (2, 2)]
    assert [a["restart"]["backoff_s"] for a in envelope["attempts"]] == [0.2, 0.4, None]
    assert envelope["attempts"][2]["restart"]["why"] == "no restart left (--max-restarts 2)"
    assert (marks / "crashes").read_text() == "3"
    assert (marks / "env-0-2").exists() and not (marks / "env-0-3").exists()
    assert "attempt 3/3 was the last: no restart left" in out


@pytest.mark.fault("F33")
def test_a_cancel_during_an_attempt_is_never_restarted(tmp_path: Path, marks: Path) -> None:
    run = start(["--max-restarts", "2", *FAST, "--nproc-per-node", "2", CRASH, str(marks),
                 "1", "exit:0", "hang"], tmp_path)
    wait_for(lambda: (marks / "env-0-0").exists() and (marks / "env-1-0").exists(), 30,
             "both ranks to start")
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    envelope = run.envelope()
    assert _attempts(envelope) == [(0, 2)]
    assert envelope["attempts"][0]["restart"]["why"] == "the run was cancelled"
    assert envelope["cancelled"]["by"] == "SIGTERM to the supervisor"


@pytest.mark.fault("F33")
def test_a_cancel_during_the_backoff_ends_the_run_at_once(tmp_path: Path, marks: Path) -> None:
    run = start(["--max-restarts", "2", "--restart-backoff", "30", "--nproc-per-node", "2",
                 CRASH, str(marks), "1", "exit:9", "always"], tmp_path)
    wait_for(lambda: b"restarting after" in (run.run_dir / "envelope.json").read_bytes()
             if (run.run_dir / "envelope.json").exists() else False, 30, "the backoff")
    run.signal(signal.SIGINT)
    assert run.wait(10) == 2  # the last attempt's verdict: rank 1 failed
    envelope = run.envelope()
    assert _attempts(envelope) == [(0, 2)]
    assert envelope["attempts"][0]["restart"]["restarted"] is False
    assert envelope["attempts"][0]["restart"]["why"] == (
        "cancelled during the backoff by SIGINT to the supervisor")
    assert envelope["cancelled"]["by"] == "SIGINT to the supervisor"
    assert not (run.run_dir / "attempt-1").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (["--max-restarts", "two"], "--max-restarts must be a whole number"),
    (["--max-restarts", "-1"], "--max-restarts must not be negative"),
    (["--restart-backoff", "-1"], "--restart-backoff must not be negative"),
])
@pytest.mark.fault("F40")
def test_restart_options_refused_in_one_line(tmp_path: Path, args: list[str], expected: str,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's main() in-process: refused before launch (the console script's own process
    for such a refusal: test_bad_input.py::test_bad_input_in_a_real_process)."""
    from forgelm_tui.cli import main

    run_dir = tmp_path / "run"
    if "--nnodes" in args:
        args = ["--max-restarts", "1", *args]
    monkeypatch.chdir(tmp_path)
    for key, value in cli_env().items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    code = main(["--no-tui", "--run-dir", str(run_dir), *args, rank_script("exit_with.py"), "0"])
    out, err = capsys.readouterr()
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], err
    assert "Traceback" not in err + out
    [path] = run_dir.rglob("envelope.json")  # a multi-node run's is in node-0/
    envelope = json.loads(path.read_text())
    assert envelope["exit_code"] == 1 and expected in envelope["error"]
    assert envelope["attempts"] == [] and envelope["ranks"] == []
