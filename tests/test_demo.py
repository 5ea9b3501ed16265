"""The built-in demo, headless: a real DDP (gloo) run that can misbehave on request."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

pytestmark = pytest.mark.timeout(90)


def test_demo_trains_and_exits_with_the_chosen_code(tmp_path: Path) -> None:
    """One rank trains to its end (reporting through the progress channel), exits with 4."""
    run = run_cli(["demo", "--nproc-per-node", "1", "--steps", "3", "--step-time", "0",
                   "--exit-code", "4"], tmp_path, timeout=80)
    out, _ = run.output()
    assert run.proc.returncode == 4
    assert "[rank 0] step 3/3 loss" in out
    envelope = run.envelope()
    assert envelope["mode"] == "demo"
    (rank,) = envelope["ranks"]
    assert rank["progress"]["source"] == "channel"
    assert (rank["progress"]["step"], rank["progress"]["total"]) == (3, 3)
    assert [step for step, _ in rank["metrics_history"]["loss"]] == [1, 2, 3]


def test_the_demo_s_options_reach_its_ranks(tmp_path: Path) -> None:
    """In process: every demo option goes to the demo's ranks, 2 of them by default."""
    from forgelm_tui.plan.planner import Planner

    plan = Planner(["--no-tui", "--run-dir", str(tmp_path / "run"), "demo", "--steps", "3",
                    "--step-time", "0", "--hang-rank", "1", "--exit-code", "4"], "test").plan()
    argv = list(plan.spec.argv)
    assert argv[argv.index("-m") + 1] == "forgelm_tui.demo.train"
    options = argv[argv.index("-m") + 2:]
    assert dict(zip(options[::2], options[1::2], strict=True)) == {
        "--steps": "3", "--fail-code": "2", "--fail-step": "10", "--hang-rank": "1",
        "--hang-step": "10", "--exit-code": "4", "--step-time": "0.0",
        "--cleanup-seconds": "0.0"}
    assert plan.spec.nproc_per_node == 2 and plan.info.mode == "demo"


# A demo rank crashing (--fail-raise: the exception and traceback in the envelope), across
# nodes: test_multinode.py::test_demo_rank_on_node_1_crashes_mid_run. A rank's own exit code
# as the root cause: test_exit_codes.py.


def test_cancelling_the_demo_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    import signal

    from conftest import start, wait_for

    run = start(["demo", "--steps", "500", "--step-time", "0.05"], tmp_path)
    logs = [run.run_dir / f"rank-{r}.stdout.log" for r in range(2)]
    wait_for(lambda: all(p.exists() and "step 3/500" in p.read_text() for p in logs), 60,
             "every rank to train")
    run.signal(signal.SIGINT)  # an operator's Ctrl+C
    assert run.wait(30) == 2
    envelope = run.envelope()
    steps = [r["stopped_at_step"] for r in envelope["ranks"]]
    assert steps[0] is not None and len(set(steps)) == 1, steps
    for rank in envelope["ranks"]:
        assert rank["exit_code"] == 2 and rank["signalled_by_supervisor"] is True
        assert rank["progress"]["step"] == steps[0]
        assert rank["progress"]["total"] == 500
        assert rank["stopped_from_outside"] is False
    assert (run.run_dir / "demo-checkpoint.pt").exists()
    assert envelope["mode"] == "demo"
    out, _ = run.output()
    assert f"rank 0: stopping together at step {steps[0]} (SIGTERM)" in out
    assert "[rank 0] step 3/500 loss" in out and "[rank 1] step 3/500 loss" in out
