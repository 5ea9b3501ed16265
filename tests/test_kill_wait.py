"""The stop's grace fitted to the scheduler's SIGTERM -> SIGKILL window (issue 20, point 2).

The rule in-process (cluster/kill_wait.py: no scheduler needed); the wiring through the CLI
with a stand-in ``scontrol`` inside a stand-in SLURM job's environment. A real SLURM cluster's
KillWait reaching a real run is the slurm-marked tests' (issue 20, point 5).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import rank_script, run_cli

from forgelm_tui.cluster.kill_wait import (
    KILL_WAIT_ENV,
    KillWaitError,
    choose_grace,
    parse_kill_wait,
    scheduler_reaches_ranks,
)

pytestmark = pytest.mark.timeout(60)
SHOW_CONFIG = """Configuration data as of 2026-12-03T06:00:00
AccountingStorageType   = accounting_storage/none
KillOnBadExit           = 0
KillWait                = 30 sec
MessageTimeout          = 10 sec
"""


def never() -> float | None:
    raise AssertionError("scontrol read where the window was already known or no job runs")


def test_scontrol_s_kill_wait_is_read() -> None:
    assert parse_kill_wait(SHOW_CONFIG) == 30.0
    assert parse_kill_wait(SHOW_CONFIG.replace("30 sec", "120 sec")) == 120.0
    assert parse_kill_wait("KillOnBadExit = 0\n") is None  # KillWait itself, not a prefix
    assert parse_kill_wait("") is None


def test_outside_a_scheduler_the_grace_is_30_s_or_the_one_given() -> None:
    choice = choose_grace(None, None, {}, never)
    assert (choice.grace, choice.source, choice.window, choice.warning) == (30.0, "default",
                                                                           None, None)
    choice = choose_grace(90.0, None, {}, never)
    assert (choice.grace, choice.source, choice.warning) == (90.0, "--grace", None)


def test_under_slurm_the_default_grace_leaves_5_s_of_kill_wait() -> None:
    job = {"SLURM_JOB_ID": "42"}
    choice = choose_grace(None, None, job, lambda: 30.0)
    assert (choice.grace, choice.source, choice.window) == (25.0, "SLURM KillWait", 30.0)
    assert choice.warning is None
    assert choose_grace(None, None, job, lambda: 10.0).grace == 5.0  # the test cluster's
    assert choose_grace(None, None, job, lambda: 4.0).grace == 1.0  # never under 1 s
    # scontrol not there or failing: the default, no guess
    assert choose_grace(None, None, job, lambda: None).source == "default"


def test_the_window_given_wins_over_scontrol() -> None:
    job = {"SLURM_JOB_ID": "42", KILL_WAIT_ENV: "60"}
    choice = choose_grace(None, None, job, never)
    assert (choice.grace, choice.window_source) == (55.0, KILL_WAIT_ENV)
    choice = choose_grace(None, 20.0, job, never)  # --kill-wait over the environment
    assert (choice.grace, choice.window_source) == (15.0, "--kill-wait")
    assert choose_grace(None, None, {KILL_WAIT_ENV: "12"}, never).grace == 7.0  # no SLURM
    with pytest.raises(KillWaitError, match="not a number"):
        choose_grace(None, None, {KILL_WAIT_ENV: "soon"}, never)
    with pytest.raises(KillWaitError, match="more than 0"):
        choose_grace(None, None, {KILL_WAIT_ENV: "0"}, never)


def test_a_grace_longer_than_the_window_is_kept_with_a_warning() -> None:
    choice = choose_grace(30.0, None, {"SLURM_JOB_ID": "42"}, lambda: 30.0)
    assert choice.grace == 30.0 and choice.warning is not None
    assert "SLURM KillWait 30 s" in choice.warning and "--grace 25 fits" in choice.warning
    assert choose_grace(25.0, None, {"SLURM_JOB_ID": "42"}, lambda: 30.0).warning is None


def _scontrol(tmp_path: Path, kill_wait: int) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    config = SHOW_CONFIG.replace("30 sec", f"{kill_wait} sec")
    script.write_text(f'#!/bin/sh\n[ "$*" = "show config" ] || exit 1\ncat <<"EOF"\n{config}EOF\n')
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}


def test_the_cli_takes_kill_wait_from_scontrol_and_warns_about_a_longer_grace(
        tmp_path: Path) -> None:
    """Not inside an srun step (no SLURM_STEP_ID): one node, the job's KillWait still holds."""
    env = _scontrol(tmp_path, 12)
    (tmp_path / "fitted").mkdir()
    (tmp_path / "longer").mkdir()
    run = run_cli(["--nproc-per-node", "1", rank_script("exit_with.py"), "0"],
                  tmp_path / "fitted", env=env)
    assert run.proc.returncode == 0
    settings = run.envelope()["settings"]
    assert (settings["grace_s"], settings["grace_source"], settings["kill_window_s"]) == (
        7.0, "SLURM KillWait", 12.0)
    _, err = run.output()
    assert "warning" not in err
    run = run_cli(["--grace", "20", "--nproc-per-node", "1", rank_script("exit_with.py"), "0"],
                  tmp_path / "longer", env=env)
    assert run.proc.returncode == 0
    _, err = run.output()
    assert "[forgelm-tui] warning: --grace 20 s is longer than the scheduler allows " \
           "(SLURM KillWait 12 s" in err
    assert run.envelope()["settings"]["grace_source"] == "--grace"


def test_a_bad_kill_wait_is_one_line_and_exit_1(tmp_path: Path) -> None:
    run = run_cli(["--kill-wait", "-3", "--output-format", "json", "--nproc-per-node", "1",
                   rank_script("exit_with.py"), "0"], tmp_path)
    assert run.proc.returncode == 1
    out, err = run.output()
    (line,) = err.strip().splitlines()
    assert line.startswith("forgelm-tui: error: --kill-wait must be more than 0 seconds (exit 1")
    assert json.loads(out)["exit_name"] == "EXIT_CONFIG_ERROR"


@pytest.mark.parametrize(("env", "config", "expected"), [
    ({"SLURM_JOB_ID": "7"}, "ProctrackType           = proctrack/linuxproc\n", True),
    ({"SLURM_JOB_ID": "7"}, "ProctrackType           = proctrack/cgroup\n", False),
    ({"SLURM_JOB_ID": "7"}, None, False),  # scontrol did not answer: forward, as always
    ({}, "ProctrackType = proctrack/linuxproc\n", False),  # not inside a SLURM job
])
def test_the_schedulers_signals_reach_the_ranks_only_under_linuxproc(
        env: dict[str, str], config: str | None, expected: bool) -> None:
    assert scheduler_reaches_ranks(env, lambda: config) is expected
