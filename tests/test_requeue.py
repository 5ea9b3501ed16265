"""A requeued SLURM job (issue 25, point 3): the same job id and run id again; each requeue's
files go in ``requeue-<SLURM_RESTART_COUNT>/`` of the run dir, never over the earlier runs',
and its envelope lists them in ``requeues``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_nodes import start_nodes, wait_all
from conftest import rank_script, run_cli

pytestmark = pytest.mark.timeout(120)

CRASH = rank_script("crash_once.py")


def test_each_requeue_of_a_job_keeps_its_own_files_and_lists_the_earlier_ones(
        tmp_path: Path, marks: Path) -> None:
    run_dir = tmp_path / "run"  # --run-dir (conftest.start), as a batch script gives it
    for count in range(3):  # the batch script run again by SLURM: same --run-dir
        run = run_cli(["--nproc-per-node", "1", CRASH, str(marks), "0", "exit:3"], tmp_path,
                      env={"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": str(count)})
        run.output()
        assert run.proc.returncode == (3 if count == 0 else 0)
    first = json.loads((run_dir / "envelope.json").read_text())
    assert (first["exit_code"], first["requeues"]) == (3, None)
    assert (run_dir / "rank-0.stdout.log").read_text() == "rank 0 attempt 0\n"  # not overwritten
    last = json.loads((run_dir / "requeue-2" / "envelope.json").read_text())
    assert last["run_dir"] == str(run_dir / "requeue-2")
    assert last["requeues"] == {"count": 2, "earlier": [
        {"requeue": 0, "envelope": str(run_dir / "envelope.json"), "exit_code": 3},
        {"requeue": 1, "envelope": str(run_dir / "requeue-1" / "envelope.json"),
         "exit_code": 0}]}
    assert (run_dir / "requeue-1" / "rank-0.stdout.log").exists()


def test_a_requeued_multi_node_job_writes_beside_the_run_it_repeats(
        tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(2, [CRASH, str(marks), "9", "exit:3"], tmp_path,
                        common=["--nproc-per-node", "1"],
                        env={"SLURM_JOB_ID": "78", "SLURM_RESTART_COUNT": "1"})
    assert wait_all(nodes, 90) == [0, 0], [n.output() for n in nodes]
    for node in nodes:
        where = node.run_dir / "requeue-1"
        envelope = json.loads((where / "envelope.json").read_text())
        assert envelope["run_dir"] == str(where)
        assert envelope["requeues"] == {"count": 1, "earlier": [
            {"requeue": 0, "envelope": None, "exit_code": None}]}  # that run left nothing here
        assert (where / f"rank-{node.rank}.stdout.log").exists()
        assert not (node.run_dir / "envelope.json").exists()
    envelopes = [json.loads((n.run_dir / "requeue-1" / "envelope.json").read_text())
                 for n in nodes]
    assert envelopes[0]["exit_code"] == envelopes[1]["exit_code"] == 0
