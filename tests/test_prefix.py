"""The launcher in front of which forgelm-tui is put (issue 26, first part; plan/prefix.py):
``forgelm-tui [own options] torchrun ARGS`` plans exactly as ``forgelm-tui [own options]
ARGS``; so do ``python -m torch.distributed.run`` and its interpreter spellings. What is no
prefix, and what is refused, in one line each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import rank_script, run_cli

from forgelm_tui.plan.options import UsageError
from forgelm_tui.plan.planner import Plan, Planner
from forgelm_tui.plan.prefix import launcher_of, python_word

pytestmark = pytest.mark.timeout(60)
SCRIPT_ARGS = ["--nproc_per_node=2", "train.py", "--lr", "1", "--nproc_per_node", "9"]


def plan(tmp_path: Path, *args: str) -> Plan:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return Planner(["--no-tui", "--run-dir", str(tmp_path / "run"), *args], "test").plan()


@pytest.mark.parametrize("launcher", [
    ["torchrun"], ["python", "-m", "torch.distributed.run"],
    ["python3", "-m", "torch.distributed.run"], ["python3.11", "-m", "torch.distributed.run"],
    [sys.executable, "-m", "torch.distributed.run"],
], ids=["torchrun", "python", "python3", "python3.11", "absolute"])
def test_a_launcher_in_front_plans_as_its_arguments_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    plain = plan(tmp_path, *SCRIPT_ARGS)
    behind = plan(tmp_path, *launcher, *SCRIPT_ARGS)
    assert behind.spec.nproc_per_node == plain.spec.nproc_per_node == 2
    assert behind.spec.argv == plain.spec.argv
    assert behind.spec.argv[-5:] == ("train.py", "--lr", "1", "--nproc_per_node", "9")
    assert behind.info.mode == plain.info.mode == "script"


def test_what_is_no_launcher() -> None:
    assert launcher_of(["./torchrun", "x.py"]) is None  # a script named so, by its path
    assert launcher_of(["train.py", "torchrun"]) is None
    assert launcher_of(["python", "train.py"]) is None
    assert launcher_of(["python", "-m", "torch.distributed.launch"]) is None
    assert launcher_of(["venv/bin/python", "-m", "torch.distributed.run"]) is None  # relative
    assert not python_word("pythonw") and not python_word("python3.x")
    assert python_word("/usr/bin/python3.11") and python_word("python")


def test_a_script_named_torchrun_is_run_when_given_by_its_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "torchrun").write_text("print('a script')\n")
    got = plan(tmp_path, "./torchrun", "--lr", "1")
    assert got.spec.argv[-3:] == ("./torchrun", "--lr", "1")


@pytest.mark.parametrize(("args", "words"), [
    (["--no-python", "torchrun", "x.py"], "--no-python torchrun: every rank would run"),
    (["torchrun", "--nproc_per_node", "2", "--grace", "5", "x.py"],
     "--grace is forgelm-tui's own option: put it before 'torchrun'"),
    (["torchrun", "--no-tui", "x.py"], "--no-tui is forgelm-tui's own option"),
    (["accelerate", "launch", "--grace", "5", "x.py"], "--grace is forgelm-tui's own option: "
     "put it before 'accelerate launch'"),
    (["--no-python", "python", "-m", "accelerate.commands.launch", "x.py"],
     "--no-python python -m accelerate.commands.launch: every rank would run"),
    (["deepspeed", "--run-dir", "r", "x.py"], "--run-dir is forgelm-tui's own option"),
], ids=["no-python", "grace-after", "no-tui-after", "accelerate", "accelerate-module",
        "deepspeed"])
def test_what_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     args: list[str], words: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as caught:
        plan(tmp_path, *args)
    assert words in str(caught.value)


def test_an_own_option_named_after_the_program_is_the_programs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    got = plan(tmp_path, "torchrun", "--nproc_per_node", "2", "train.py", "--grace", "5")
    assert got.spec.argv[-3:] == ("train.py", "--grace", "5") and got.spec.grace == 30.0


def test_forgelms_documented_torchrun_lines_plan_as_forgelm_mode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ForgeLM's docs: ``torchrun --nproc_per_node=4 -m forgelm.cli --config job.yaml`` and
    its template's ``torchrun ... forgelm --config job.yaml``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("training: {}\n")
    for line in (["torchrun", "--nproc_per_node=2", "-m", "forgelm.cli", "--config", "job.yaml"],
                 ["torchrun", "--nproc_per_node", "2", "forgelm", "--config", "job.yaml"]):
        got = plan(tmp_path, *line)
        assert got.info.mode == "forgelm" and got.spec.nproc_per_node == 2, line
        at = got.spec.argv.index("--config")
        assert got.spec.argv[at + 1] == "job.yaml"


def test_the_true_code_comes_back_through_the_torchrun_prefix(tmp_path: Path) -> None:
    run = run_cli(["torchrun", "--nproc_per_node=2", rank_script("exit_with.py"), "0", "0=4"],
                  tmp_path)
    out, err = run.output()
    assert run.proc.returncode == 4, out + err
    assert run.envelope()["world_size"] == 2
