"""forgelm-tui under a real SLURM 22.05 (Debian's slurm-wlm): two compute nodes in network
namespaces (tests/slurm/cluster.sh), `sbatch` + `srun --ntasks-per-node=1`, 2 nodes x 2 gloo
ranks, KillWait 10 s. Needs root and the cluster up (.ci/run brings it up and sets
FORGELM_TUI_REQUIRE_SLURM=1, which turns the skip into a failure); `-m slurm` selects them.

The jobs are submitted together (tests/slurm_jobs.py) and run side by side; these tests are
moved to the front of the session (conftest.py) so the slowest, a time limit slurmctld
enforces 60-90 s late, runs while the rest of the suite does.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from slurm_jobs import CLUSTER, NODE_TIMEOUT, Job, qos_preemption, skip_or_fail, submit_all

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(660)]


@pytest.fixture(scope="session")
def slurm_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    skip_or_fail()
    # one record per test session: the workers' base temps share the session's dir; without
    # xdist the base temp is the session's own (its parent holds every earlier session's)
    base = tmp_path_factory.getbasetemp()
    return submit_all((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
                      / "slurm-jobs")


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def every_node(job: Job) -> list[dict[str, Any]]:
    """Both nodes' final envelopes: on disk, final, the same verdict."""
    envelopes = [job.envelope(0), job.envelope(1)]
    for envelope in envelopes:
        assert envelope["provisional"] is False, envelope["node_rank"]
    assert envelopes[0]["exit_code"] == envelopes[1]["exit_code"]
    assert envelopes[0]["decided_by"] == envelopes[1]["decided_by"]
    return envelopes


def cleanups_finished(job: Job) -> None:
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        for rank in ranks:
            assert f"rank {rank}: cleanup finished" in job.log(node, rank), (node, rank)


def one_stop_request(envelope: dict[str, Any]) -> None:
    """The burst merged: one request began the stop on each node, nothing escalated."""
    requests = envelope["cancel_requests"]
    assert requests, envelope["cancel_requests"]
    assert [r["effect"] for r in requests].count("kill") == 0, requests
    for node in (0, 1):
        mine = [r for r in requests if r["node_rank"] == node]
        assert all(r["effect"] == "merged" for r in mine[1:]), mine
        assert all((r["sender"] or {}).get("kind") == "scheduler" for r in mine), mine
    for rank in envelope["ranks"]:  # (the grace's own SIGKILL may end a slow exit)
        assert not any(s["purpose"] == "kill" and "second cancel" in s["reason"]
                       for s in rank["signals_sent"]), rank["signals_sent"]


def _told(rank: dict[str, Any]) -> str:
    """A rank's record and the end of its stderr, for a failure's message (where it was)."""
    try:
        tail = Path(rank["stderr_log"]).read_text(errors="replace")[-4000:]
    except (KeyError, OSError) as exc:
        tail = f"(no stderr log: {exc})"
    return f"{rank}\n--- its stderr, last 4000 characters ---\n{tail}"


def forgelm_stopped_mid_training(job: Job) -> None:
    """Every rank of the real ForgeLM was training when the limit came, caught the stop (the
    graceful runner), and finished ForgeLM's cleanup: ``pipeline.failed`` in the audit log and
    its JSON result (both nodes share the output directory, as nodes on a shared filesystem
    do). Then it exits 2; on this 2-core machine, with the suite running beside it, the
    interpreter's teardown (~1.5 s of CPU per ForgeLM rank, mostly its final garbage
    collections) may outlast the 5 s grace (KillWait 10 s), and the grace's SIGKILL ends it
    after its cleanup: the envelope says which."""
    from forgelm_job import read_audit_log

    for node in (0, 1):
        envelope = job.envelope(node)
        assert envelope["mode"] == "forgelm" and envelope["settings"]["graceful"] is True
        for rank in envelope["ranks"]:
            # "stopped by SIGTERM", or the failed collective of a rank that a peer, stopped a
            # few ms earlier, left (docs/rank-helpers.md): ForgeLM's cleanup ran either way
            result = rank["forgelm_result"]
            assert result is not None and result["success"] is False, _told(rank)
            kill = [s for s in rank["signals_sent"] if s["purpose"] == "kill"]
            assert rank["exit_code"] == 2 or (
                rank["signal"] == "SIGKILL" and [s["reason"] for s in kill]
                == [f"grace of {envelope['settings']['grace_s']:g} s ended"]), rank
    last_exit = json.loads((job.root / "job" / "out" / "last_exit.json").read_text())
    assert last_exit["node_rank"] == 0 and last_exit["exit_code"] == 2  # node 0 alone writes it
    events = read_audit_log(job.root / "job" / "out")
    started = {e["run_id"] for e in events if e["event"] == "training.started"}
    failed = {e["run_id"]: e for e in events if e["event"] == "pipeline.failed"}
    assert len(started) == 4, events
    assert started <= set(failed), (started, failed)


def supervisor_pid(job: Job, rank: int) -> int:
    """The forgelm-tui whose rank wrote its ready mark: that rank's parent."""
    pid = int((job.marks / f"ready-{rank}").read_text().split()[0])
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("PPid:")).split()[1])


def ready(job: Job, ranks: int = 4, timeout: float = 240) -> None:
    wait_for(lambda: all((job.marks / f"ready-{r}").exists() for r in range(ranks)), timeout,
             f"job {job.name}: every rank ready")


def training(job: Job, timeout: float = 240) -> None:
    wait_for(lambda: "step 3/" in job.log(1, 3), timeout, f"job {job.name}: rank 3 training")


def test_awaiting_approval_is_4_on_every_node_and_in_sacct(slurm_jobs: dict[str, Job]) -> None:
    job = slurm_jobs["approval"]
    _, code = job.wait_end(240)
    assert code == "4:0", job.sacct()
    for envelope in every_node(job):
        assert envelope["exit_code"] == 4 and envelope["exit_name"] == "EXIT_AWAITING_APPROVAL"
        assert envelope["nnodes"] == 2 and envelope["world_size"] == 4
    assert {n["host"] for n in job.envelope(0)["nodes"]} == {"fnode1", "fnode2"}


def test_a_remote_rank_failure_is_2_naming_it(slurm_jobs: dict[str, Job]) -> None:
    job = slurm_jobs["failure"]
    _, code = job.wait_end(240)
    assert code == "2:0", job.sacct()
    for envelope in every_node(job):
        assert envelope["exit_code"] == 2 and envelope["root_cause_rank"] == 3
        assert envelope["stop"]["kind"] == "failure" and envelope["stop"]["origin_node"] == 1


def test_scancel_is_one_graceful_stop_every_cleanup_finished(
        slurm_jobs: dict[str, Job]) -> None:
    job = slurm_jobs["scancel"]
    training(job)
    job.scancel()
    state, _ = job.wait_end(120)
    assert state == "CANCELLED", job.sacct()
    for envelope in every_node(job):
        assert envelope["exit_code"] == 2 and envelope["decided_by"]["rule"] == 4
        one_stop_request(envelope)
        assert envelope["stop"]["scheduler"]["kind"] == "scancel", envelope["stop"]
        assert envelope["settings"]["kill_window_s"] == 10  # KillWait, from scontrol
        assert envelope["settings"]["grace_s"] == 5
    cleanups_finished(job)


@pytest.mark.parametrize("name", ["time_limit_demo", "time_limit_runner", "time_limit_forgelm"])
def test_a_time_limit_is_one_graceful_stop_every_cleanup_finished(
        slurm_jobs: dict[str, Job], name: str) -> None:
    """slurmstepd at the limit: SIGTERM, SIGCONT, SIGTERM to the step's tasks (every process of
    the step under proctrack/linuxproc), then SIGKILL KillWait (10 s) later. The demo's ranks
    (forgelm_tui.rank's stop agreement), a ForgeLM-style rank under the graceful runner
    (cleanup in ``except Exception``) and the real ForgeLM in ForgeLM mode alike."""
    job = slurm_jobs[name]
    state, code = job.wait_end(340)
    # TIMEOUT, or FAILED 2 when the batch script (which ignores SIGTERM) ended with srun's 2
    # before the scheduler's SIGKILL
    assert state == "TIMEOUT" or (state, code) == ("FAILED", "2:0"), job.sacct()
    for envelope in every_node(job):
        assert envelope["exit_code"] == 2 and envelope["decided_by"]["rule"] == 4
        one_stop_request(envelope)
        scheduler = envelope["stop"]["scheduler"]
        assert scheduler["kind"] == "time_limit", envelope["stop"]
        assert _at(envelope["ended_at"]) - _at(envelope["stop"]["at"]) < 10  # before SIGKILL
    if name == "time_limit_demo":
        cleanups_finished(job)
        return
    if name == "time_limit_forgelm":
        forgelm_stopped_mid_training(job)
        return
    for rank in range(4):
        assert (job.marks / f"cleanup-{rank}").read_text() == "done", rank
        # --signal=USR1@40 (80-140 s in), once per rank: forwarded by forgelm-tui under
        # proctrack/cgroup (slurmstepd signals only the task), recorded only under linuxproc
        # (it signals all)
        assert len((job.marks / f"usr1-{rank}").read_text().splitlines()) == 1, rank
    forwarded = job.envelope(0)["forwarded_signals"]
    assert {f["node_rank"] for f in forwarded} == {0, 1}, forwarded
    for entry in forwarded:
        assert entry["signal"] == "SIGUSR1" and entry["sender"]["kind"] == "scheduler", entry


def test_preemption_is_one_graceful_stop_every_cleanup_finished(
        slurm_jobs: dict[str, Job]) -> None:
    """A job of the `urgent` partition (PriorityTier 10) needs 15 CPUs of each node; the demo,
    the one job of `low` (tier 1, PreemptMode=CANCEL, GraceTime=5), holds 14 of the 28: it is
    preempted, whatever else runs. slurmstepd sends SIGTERM + SIGCONT at once (the job still
    RUNNING, PreemptTime set) and the kill's SIGTERM, SIGCONT, SIGTERM later."""
    job = slurm_jobs["preempted"]
    qos = qos_preemption(job.env)  # FSLURM_PREEMPT=qos: QOS urgent preempts QOS low
    training(job)
    urgent = subprocess.run(
        ["sbatch", "--parsable", "--partition=urgent", "-N2", "--ntasks-per-node=1",
         *(["--qos=urgent"] if qos else []),
         "--cpus-per-task=15", f"--output={job.root / 'urgent.out'}", "--wrap=true"],
        capture_output=True, text=True, env=job.env, timeout=60, check=True).stdout.strip()
    state, _ = job.wait_end(120)
    assert state in ("PREEMPTED", "FAILED"), job.sacct()
    for envelope in every_node(job):
        assert envelope["exit_code"] == 2 and envelope["decided_by"]["rule"] == 4
        one_stop_request(envelope)
        assert envelope["stop"]["scheduler"]["kind"] == "preempted", envelope["stop"]
        evidence = envelope["stop"]["scheduler"]["evidence"]  # where slurmctld takes GraceTime
        assert (evidence["preempt_type"], evidence["grace_time_of"]) == (
            ("preempt/qos", "QOS low") if qos else ("preempt/partition_prio", "partition low"))
        # the window is GraceTime 5 + KillWait 10: the derived grace grew from 5 s to 10 s
        assert envelope["stop"]["grace_s"] == 10, envelope["stop"]
        assert envelope["stop"]["grace_from"] == (
            "preempted: GraceTime 5 s + SLURM KillWait 10 s, less 5 s"), envelope["stop"]
    assert job.slurm_out().count(  # each node's headless line says it
        "grace now 10 s: preempted: GraceTime 5 s + SLURM KillWait 10 s, less 5 s") == 2
    cleanups_finished(job)
    Job("urgent", urgent.split(";")[0], job.root, job.env).wait_end(60)


def test_a_sigkilled_node_is_named_as_the_cause(slurm_jobs: dict[str, Job]) -> None:
    job = slurm_jobs["sigkill_node"]
    ready(job)
    os.kill(supervisor_pid(job, 2), 9)
    wait_for(lambda: (job.node_dir(0) / "envelope.json").exists()
             and job.envelope(0)["provisional"] is False, 60, "node 0's final envelope")
    envelope = job.envelope(0)
    assert envelope["exit_code"] == 2
    assert envelope["decided_by"]["node"] == 1, envelope["decided_by"]
    assert "root cause: node 1 was lost" in envelope["decided_by"]["explanation"]
    assert envelope["agreement"]["nodes_lost"] == [1]
    job.wait_end(120)


def test_a_node_cut_off_the_network_ends_the_other_within_node_timeout_and_grace(
        slurm_jobs: dict[str, Job]) -> None:
    job = slurm_jobs["network_cut"]
    ready(job)
    others = [j for j in slurm_jobs.values() if j is not job]
    # a cut of fnode2 cuts every job on it: the others end first (the slowest, a time limit,
    # some 210 s after the submission; the rest when their tests have acted, maybe on this
    # very worker after this test: none of them waits for another job)
    wait_for(lambda: not any(j.queued() for j in others), 480, "every other job to end")
    cut = time.time()
    subprocess.run(["bash", str(CLUSTER), "cut", "fnode2"], check=True, timeout=30)
    try:
        wait_for(lambda: (job.node_dir(0) / "envelope.json").exists()
                 and job.envelope(0)["provisional"] is False, 60, "node 0's final envelope")
    finally:
        subprocess.run(["bash", str(CLUSTER), "heal", "fnode2"], check=True, timeout=30)
    envelope = job.envelope(0)
    assert envelope["exit_code"] == 2 and envelope["agreement"]["nodes_lost"] == [1]
    assert envelope["stop"]["kind"] == "node_lost" and envelope["stop"]["lost_node"] == 1
    took = _at(envelope["ended_at"]) - cut
    assert took < NODE_TIMEOUT + 3 + 5, \
        f"node 0 ended {took:.1f} s after the cut (node timeout {NODE_TIMEOUT}, grace 3)"
    job.wait_end(180)


def test_a_requeued_job_keeps_each_runs_files_and_lists_the_earlier_run(
        slurm_jobs: dict[str, Job]) -> None:
    """``scontrol requeue`` while the demo trains (the batch script does it, as a preemption
    with PreemptMode=REQUEUE would): the first run stops gracefully (2), SLURM starts the batch
    script again (2 minutes later: a requeued job's EligibleTime) with the same job id and step
    0 (the same run id) and SLURM_RESTART_COUNT=1: the second run writes each node's
    requeue-1/, the first run's files stay, and its envelope lists the first run's (issue 25;
    docs/schedulers.md)."""
    job = slurm_jobs["requeue"]
    state, code = job.wait_end(420)
    assert (state, code) == ("COMPLETED", "0:0"), job.sacct()
    for node in (0, 1):
        first = job.envelope(node)
        assert (first["exit_code"], first["requeues"], first["run_id"]) == (
            2, None, f"slurm-{job.job_id}.0")
        assert first["stop"]["kind"] == "cancel"
        where = job.node_dir(node) / "requeue-1"
        envelope = json.loads((where / "envelope.json").read_text())
        assert (envelope["exit_code"], envelope["run_id"]) == (0, first["run_id"])
        assert envelope["run_dir"] == str(where)
        assert envelope["requeues"] == {"count": 1, "earlier": [
            {"requeue": 0, "envelope": str(job.node_dir(node) / "envelope.json"),
             "exit_code": 2}]}
        for rank in (2 * node, 2 * node + 1):  # the first run's logs, not overwritten
            assert "step 3/" in job.log(node, rank)
            assert "step 5/5" in (where / f"rank-{rank}.stdout.log").read_text()


def test_the_launchers_multi_node_forms_under_srun_are_one_run(
        slurm_jobs: dict[str, Job]) -> None:
    """``srun forgelm-tui deepspeed --hostfile H --no_ssh --node_rank $SLURM_NODEID
    --master_addr NODE0 ...`` and ``srun forgelm-tui accelerate launch --num_machines 2
    --machine_rank $SLURM_NODEID --main_process_ip NODE0 ...`` (docs/launchers.md): one run of
    4 ranks across the two nodes each, rank 0's 4 on both nodes, the launcher's rank
    environment (CROSS_RANK under deepspeed, GROUP_RANK under accelerate's torchrun)."""
    job = slurm_jobs["launchers"]
    state, code = job.wait_end(420)
    assert (state, code) == ("FAILED", "4:0"), (job.sacct(), job.slurm_out()[-3000:])
    for name, node_key in (("deepspeed", "CROSS_RANK"), ("accelerate", "GROUP_RANK")):
        for node in (0, 1):
            envelope = json.loads((job.root / f"run-{name}" / f"node-{node}" /
                                   "envelope.json").read_text())
            assert envelope["exit_code"] == 4 and envelope["world_size"] == 4, envelope
            assert envelope["launcher"]["name"] == ("deepspeed" if name == "deepspeed"
                                                    else "accelerate launch")
        dumps = [json.loads((job.root / f"dump-{name}" / f"rank-{r}.json").read_text())["env"]
                 for r in range(4)]
        assert [d[node_key] for d in dumps] == ["0", "0", "1", "1"], name
        assert len({d["SLURMD_NODENAME"] for d in dumps}) == 2  # two nodes, really
