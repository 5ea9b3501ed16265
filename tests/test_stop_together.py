"""Stop together: the patterns the helper (forgelm_tui.rank.StopAgreement) replaces are shown to
fail under a SIGTERM to one rank only; the documented example stops every rank together.

The helper itself under that injection, every rank stopping at the same step: the Lightning and
HF callbacks built on it (test_lightning.py: rank 0 of 2 signalled; test_rank_adapters.py:
rank 1 of 2); every rank signalled by an operator's Ctrl+C: the example below and the demo
(test_demo.py::test_cancelling_the_demo_stops_every_rank_at_the_same_step)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import rank_script, start, wait_for

pytestmark = pytest.mark.timeout(90)
STEPS = "400"


def _stopped_steps(run_dir: Path, ranks: int) -> list[int | None]:
    steps: list[int | None] = []
    for rank in range(ranks):
        text = (run_dir / f"rank-{rank}.stdout.log").read_text()
        found = [int(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("STOPPED at step")]
        steps.append(found[-1] if found else None)
    return steps


@pytest.mark.parametrize("pattern", ["local-flag", "handler-collective"])
def test_replaced_patterns_fail_under_the_same_injection(tmp_path: Path, pattern: str) -> None:
    """The same one-rank SIGTERM under the patterns the helper replaces: the ranks do not stop
    together. A hang (both blocked in mismatched collectives) is ended by the stall timeout."""
    run = start(["--nproc-per-node", "2", "--grace", "2", "--stall-timeout", "3",
                 rank_script("stop_loop.py"), pattern, "0", "5", STEPS], tmp_path)
    run.wait(60)
    envelope = run.envelope()
    hung = envelope["stop"] is not None and envelope["stop"]["kind"] == "stall"
    steps = _stopped_steps(run.run_dir, 2)
    clean = all(r["exit_code"] == 0 for r in envelope["ranks"]) and len(set(steps)) == 1 \
        and steps[0] is not None
    assert not clean, f"{pattern} unexpectedly stopped together: {steps}"
    if hung:  # both ranks entered the same collective number, different collectives
        mismatch = envelope["hang"]["mismatch"]
        assert sorted(mismatch) == sorted(
            {"local-flag": ["all_reduce", "barrier"],
             "handler-collective": ["all_reduce", "broadcast"]}[pattern]), envelope["hang"]
    rank1 = envelope["ranks"][1]
    stderr1 = (run.run_dir / "rank-1.stderr.log").read_text()
    assert hung or rank1["exit_code"] != 0 or "Connection" in stderr1 or rank1["signal"]


def test_documented_example_stops_together(tmp_path: Path) -> None:
    example = str(Path(__file__).resolve().parent.parent / "examples" / "stop_together.py")
    run = start(["--nproc-per-node", "2", example], tmp_path)
    logs = [run.run_dir / f"rank-{r}.stdout.log" for r in range(2)]
    wait_for(lambda: all(p.exists() and "training for" in p.read_text() for p in logs), 60,
             "the example to train")
    run.signal(signal.SIGINT)
    assert run.wait(30) == 2
    envelope = run.envelope()
    steps = [r["stopped_at_step"] for r in envelope["ranks"]]
    assert steps[0] is not None and steps[0] == steps[1]
    assert (run.run_dir / "ckpt.pt").exists()
