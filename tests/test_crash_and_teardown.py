"""Issue 12 items 2 and 3 with real processes: a crash is 2 and named; ForgeLM's deliberate 1
stays 1; a rank failing after rank 0's outcome exit is collateral in ForgeLM mode only."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from conftest import rank_script, run_cli

from forgelm_tui.engine.crash import (
    TRAILING_LINES,
    ErrorFile,
    from_error_file,
    from_stderr,
    read_error_file,
)

pytestmark = pytest.mark.timeout(90)

TRACEBACK = """\
Traceback (most recent call last):
  File "/x/train.py", line 3, in <module>
    main()
  File "/x/train.py", line 2, in main
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
"""


@pytest.mark.fault("F01")
def test_the_traceback_at_the_end_of_stderr_names_the_exception() -> None:
    assert from_stderr("hello\n" + TRACEBACK) == (
        "torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB")
    chained = TRACEBACK + "\nDuring handling of the above exception, another exception " \
        "occurred:\n\nTraceback (most recent call last):\n  File \"x\", line 1\nKeyError: 'a'\n"
    assert from_stderr(chained) == ("KeyError", "'a'")
    assert from_stderr("Traceback (most recent call last):\n  File \"x\"\nSystemError\n") == (
        "SystemError", "")
    prefixed = "".join(f"[rank1]: {line}\n" for line in TRACEBACK.splitlines())
    assert from_stderr(prefixed) == from_stderr(TRACEBACK)  # torch.distributed's excepthook
    warnings = "".join(f"[W teardown {i}]\n" for i in range(5))
    assert from_stderr(TRACEBACK + warnings) is not None  # exit-time warnings after it
    # output the rank left without a newline, then the interpreter's header on the same line
    # (the soak's run 76: binary bytes, then an uncaught RuntimeError)
    glued = "\xff\x1b partial line" + TRACEBACK
    assert from_stderr(glued) == from_stderr(TRACEBACK)


@pytest.mark.fault("F02")
def test_no_traceback_or_an_old_one_is_no_crash() -> None:
    assert from_stderr("error: config.yaml: missing key 'model'\n") is None
    assert from_stderr("") is None
    later = "".join(f"step {i}\n" for i in range(TRAILING_LINES + 1))
    assert from_stderr(TRACEBACK + later) is None  # logged, handled: the rank went on
    hostile = "Traceback (most recent call last):\n  File \"x\"\n\x1b[31mValueError\x1b[0m: no\n"
    assert from_stderr(hostile) == ("ValueError", "no")


@pytest.mark.fault("F01")
def test_the_error_file_names_the_exception(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {"message": "RuntimeError: boom\nmore",
                                            "extraInfo": {"py_callstack": TRACEBACK}}}))
    assert from_error_file(str(path)) == ("RuntimeError", "boom")
    # the envelope's ranks[].error reads the same file through the same reader
    assert read_error_file(str(path)) == ErrorFile("RuntimeError: boom\nmore", TRACEBACK, None)
    path.write_text(json.dumps({"message": "a bare message"}))
    assert read_error_file(str(path)) == ErrorFile("a bare message")
    path.write_text("not json")
    assert read_error_file(str(path)) is None
    assert from_error_file(str(path)) is None
    assert from_error_file(str(tmp_path / "missing.json")) is None


@pytest.mark.fault("F01")
def test_a_plain_script_raising_is_a_crash_named_in_the_verdict(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "2", "--grace", "5", rank_script("raise_on.py"), "1",
                   "raise"], tmp_path)
    out, _ = run.output()
    assert run.proc.returncode == 2
    envelope = run.envelope()
    assert envelope["root_cause_rank"] == 1
    assert envelope["exception"] == {"rank": 1, "type": "RuntimeError",
                                     "message": "rank 1: simulated crash"}
    assert envelope["ranks"][1]["exception"]["type"] == "RuntimeError"
    assert envelope["ranks"][1]["exit_code"] == 1
    assert "crashed: RuntimeError: rank 1: simulated crash" in envelope["decided_by"]["explanation"]
    assert "[forgelm-tui] exit 2 EXIT_TRAINING_ERROR (root cause: rank 1" in out


@pytest.mark.fault("F01")
def test_raw_contract_keeps_the_crash_1_and_names_it(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "2", "--grace", "5", "--exit-contract", "raw",
                   rank_script("raise_on.py"), "0", "raise"], tmp_path)
    assert run.proc.returncode == 1
    assert run.envelope()["exception"]["type"] == "RuntimeError"


@pytest.mark.fault("F02")
@pytest.mark.parametrize("mode", ["exit", "logged"])
def test_a_deliberate_exit_1_stays_1(tmp_path: Path, mode: str) -> None:
    run = run_cli(["--nproc-per-node", "2", "--grace", "5", rank_script("raise_on.py"), "1",
                   mode], tmp_path)
    assert run.proc.returncode == 1
    envelope = run.envelope()
    assert envelope["exit_name"] == "EXIT_CONFIG_ERROR" and envelope["exception"] is None
    assert envelope["ranks"][1]["exception"] is None


def _fake_forgelm(tmp_path: Path) -> dict[str, str]:
    """A ``forgelm`` package whose ``forgelm.cli`` runs tests/ranks/after_rank0.py."""
    package = tmp_path / "fake" / "forgelm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(
        "import runpy, sys\n"
        f"sys.argv = [{rank_script('after_rank0.py')!r}, '4', {str(tmp_path / 'marks')!r}]\n"
        f"runpy.run_path({rank_script('after_rank0.py')!r}, run_name='__main__')\n")
    (tmp_path / "job.yaml").write_text("training:\n  output_dir: out\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"),
                                           os.environ.get("PYTHONPATH", "")])}


@pytest.mark.fault("F18")
def test_forgelm_mode_teardown_failure_is_collateral(tmp_path: Path) -> None:
    (tmp_path / "marks").mkdir()
    env = _fake_forgelm(tmp_path)
    run = run_cli(["--nproc-per-node", "2", "--config", "job.yaml"], tmp_path, env=env)
    out, err = run.output()
    assert run.proc.returncode == 4, (out, err)
    envelope = run.envelope()
    assert envelope["mode"] == "forgelm"
    assert envelope["decided_by"]["rule"] == 3 and envelope["collateral_ranks"] == [1]
    rank1 = envelope["ranks"][1]
    assert rank1["signal"] == "SIGABRT" and rank1["collateral"] is True
    assert rank1["failed_after_rank0_exit"] is True
    assert envelope["ranks"][0]["collateral"] is False
    assert "[forgelm-tui] warning: rank 1 failed after rank 0 had exited" in out
    last_exit = json.loads((tmp_path / "out" / "last_exit.json").read_text())
    assert last_exit["collateral_ranks"] == [1]


@pytest.mark.fault("F19")
def test_other_programs_keep_rule_2_for_a_failure_after_rank0(tmp_path: Path) -> None:
    (tmp_path / "marks").mkdir()
    run = run_cli(["--nproc-per-node", "2", rank_script("after_rank0.py"), "4",
                   str(tmp_path / "marks")], tmp_path)
    out, _ = run.output()
    assert run.proc.returncode == 2
    envelope = run.envelope()
    assert envelope["root_cause_rank"] == 1 and envelope["collateral_ranks"] == []
    assert envelope["ranks"][1]["failed_after_rank0_exit"] is True
    assert envelope["ranks"][1]["collateral"] is False
    assert "note: rank 1 failed after rank 0 had exited" in out


@pytest.mark.fault("F18")
def test_the_verdict_panel_warns_of_collateral_and_names_the_exception() -> None:
    from rich.console import Console

    from forgelm_tui.tui.widgets.verdict_panel import verdict_summary

    envelope = {
        "exit_code": 4, "exit_name": "EXIT_AWAITING_APPROVAL", "exit_meaning": "model staged",
        "ci_action": "request review", "root_cause_rank": None, "collateral_ranks": [1],
        "decided_by": {"rule": 3, "explanation": "rank 0's own exit code", "rank": 0},
        "ranks": [{"rank": 0}, {"rank": 1, "collateral": True, "failed_after_rank0_exit": True},
                  {"rank": 2, "failed_after_rank0_exit": True}]}
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(verdict_summary(envelope, "/x/envelope.json"))
    text = console.export_text()
    assert "warning: rank 1 failed after rank 0 had exited: collateral (teardown)" in text
    assert "rank 2 failed after rank 0 had exited (not ForgeLM: a failure)" in text
    crashed = {**envelope, "exit_code": 2, "exit_name": "EXIT_TRAINING_ERROR",
               "root_cause_rank": 1, "collateral_ranks": [],
               "ranks": [{"rank": 0}, {"rank": 1, "stderr_log": "/x/rank-1.stderr.log",
                                       "exception": {"type": "RuntimeError",
                                                     "message": "boom \x1b[31m"}}]}
    console.print(verdict_summary(crashed, None))
    assert "root cause: rank 1: RuntimeError: boom" in console.export_text()
