"""Multi-node (SPEC §8) with real supervisors: "nodes" on 127.0.0.1, one forgelm-tui each,
agreeing through the TCPStore node 0 hosts. One stop, one verdict, every node the same code.

Each multi-node supervisor imports torch.distributed (the node link is a TCPStore): these runs
use two nodes and torch-free ranks unless a third node or gloo proves something more. The join
is tested in-process in test_cluster_join.py, liveness and the cross-node verdict on injected
clocks in test_cluster_liveness.py, a stall across nodes in test_stacks.py
(test_every_node_captures_its_ranks_stacks_before_a_stall_stop)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import Node, free_port_pair, no_orphans, same_envelopes, start_nodes, wait_all
from conftest import (
    cli_env,
    dies_with_the_test,
    pid_alive,
    rank_script,
    ready_pids,
    wait_for,
)

pytestmark = pytest.mark.timeout(150)

SLEEPER = rank_script("sleeper.py")
EXIT_WITH = rank_script("exit_with.py")


def stopped_by_supervisor(envelope: dict[str, Any], rank: int) -> bool:
    entry = next(r for r in envelope["ranks"] if r["rank"] == rank)
    return any(s["purpose"] == "stop" and s["signal"] == "SIGTERM" for s in entry["signals_sent"])


def got_sigterm(marks: Path, ranks: int) -> None:
    wait_for(lambda: all((marks / f"got-SIGTERM-{r}").exists() for r in range(ranks)), 20,
             "every rank to get SIGTERM")


def test_slurm_nodes_agree_on_rank0_s_outcome_and_drain_the_rest(tmp_path: Path) -> None:
    """Two nodes of two ranks inside a (fake) srun step with no multi-node flag: node count,
    node rank, master address (expanded by a stub scontrol) and run id come from SLURM's
    environment. Ranks 1 (node 0) and 2 (node 1) exit 0, then rank 0 4, awaiting approval;
    rank 3 (node 1) runs on: after the drain window node 0 stops it (node 0 has no rank left,
    its drain timer still runs) and the run is 4 on every node, decided by rank 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "scontrol"
    stub.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames fake[01-02]" ] || exit 1\n'
                    'printf "127.0.0.1\\nfake02\\n"\n')
    stub.chmod(0o755)
    port = free_port_pair()
    nodes = []
    for node in (0, 1):
        env = cli_env({"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
                       "SLURM_STEP_ID": "3", "SLURM_PROCID": str(node),
                       "SLURM_NODEID": str(node), "SLURM_STEP_NUM_NODES": "2",
                       "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                       "SLURM_STEP_NODELIST": "fake[01-02]"})
        proc = subprocess.Popen(
            [sys.executable, "-m", "forgelm_tui", "--no-tui", "--master-port", str(port),
             "--run-dir", str(tmp_path / "run"), "--nproc-per-node", "2", "--drain", "1",
             EXIT_WITH, "0", "0=4", "--sleep-rank", "0=1", "--sleep-rank", "3=3600"],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
            preexec_fn=dies_with_the_test)
        nodes.append(Node(node, proc, tmp_path / "run"))
    assert wait_all(nodes) == [4, 4]
    envelope = same_envelopes(nodes)
    assert envelope["run_id"] == "slurm-4242.3"
    assert envelope["nnodes"] == 2 and envelope["master_addr"] == "127.0.0.1"
    assert envelope["world_size"] == 4
    assert [r["rank"] for r in envelope["ranks"]] == [0, 1, 2, 3]
    assert [r["node_rank"] for r in envelope["ranks"]] == [0, 0, 1, 1]
    assert [r["exit_code"] for r in envelope["ranks"][:3]] == [4, 0, 0]
    # every node's ranks, counted the same on each node (same_envelopes): ranks 0-2 exited,
    # rank 3 was killed by the drain's stop
    assert envelope["rank_states"] == {"exited": 3, "killed": 1}, envelope["rank_states"]
    assert [n["state"] for n in envelope["nodes"]] == ["done"] * 2
    assert envelope["agreement"] == {"agreed": True, "decided_by_node": 0, "nodes_lost": []}
    assert envelope["exit_name"] == "EXIT_AWAITING_APPROVAL"
    assert envelope["decided_by"]["rank"] == 0 and envelope["decided_by"]["rule"] == 3
    assert envelope["stop"]["kind"] == "drain" and envelope["stop"]["origin_node"] == 0
    assert stopped_by_supervisor(envelope, 3)
    out, _ = nodes[0].output()
    assert "node 1 (" in out and "rank 2 on node 1 exited with 0" in out


def test_demo_rank_on_node_1_crashes_mid_run(tmp_path: Path) -> None:
    """The demo's ranks train over gloo across the nodes; rank 1 (node 1) raises at step 3
    while rank 0 waits in the all-reduce: every node stops, exits 2 and names rank 1, its
    exception and its traceback (read on node 1, in every node's envelope). A rank's own exit
    code as the root cause: test_exit_codes.py; across nodes: the scheduler and lost-node
    tests below."""
    nodes = start_nodes(2, ["demo", "--steps", "50", "--step-time", "0.05", "--fail-rank", "1",
                            "--fail-step", "3", "--fail-raise"], tmp_path,
                        common=["--grace", "5", "--nproc-per-node", "1"])
    assert wait_all(nodes) == [2, 2]  # exit 1 with a traceback: a crash (issue 12)
    envelope = same_envelopes(nodes)
    assert envelope["mode"] == "demo" and envelope["world_size"] == 2
    assert envelope["decided_by"]["rule"] == 2 and envelope["decided_by"]["rank"] == 1
    assert envelope["root_cause_rank"] == 1 and envelope["ranks"][1]["exit_code"] == 1
    assert envelope["exception"] == {"rank": 1, "type": "RuntimeError",
                                     "message": "rank 1: simulated crash at step 3"}
    error = envelope["ranks"][1]["error"]
    assert error is not None and "simulated crash at step 3" in error["message"]
    assert "RuntimeError" in error["traceback"] or "raise RuntimeError" in error["traceback"]
    assert envelope["stop"]["origin_node"] == 1 and envelope["stop"]["kind"] == "failure"
    outs = [node.output()[0] for node in nodes]
    for out in outs:
        assert "[forgelm-tui] exit 2 EXIT_TRAINING_ERROR (root cause: rank 1" in out
    no_orphans([p for n in nodes for p in n.rank_pids()])


def _handles(pid: int, sig: int) -> bool:
    from forgelm_tui.engine.sampler import signal_masks

    return bool(signal_masks(pid)[0] & 1 << (sig - 1))


def test_a_signal_while_the_nodes_join_is_held_until_the_rank_handles_it(
        tmp_path: Path, marks: Path) -> None:
    """sbatch --signal=USR1@N can fire while the nodes still join: node 1's supervisor holds
    the SIGUSR1 and gives it to its rank once the rank has a handler for it; node 0's rank,
    whose supervisor never got it, never does."""
    port = free_port_pair()
    (node1,) = start_nodes(2, [SLEEPER, str(marks)], tmp_path, port=port, ranks=[1])
    wait_for(lambda: _handles(node1.proc.pid, signal.SIGUSR1), 30, "node 1's signal handlers")
    node1.proc.send_signal(signal.SIGUSR1)  # no rank anywhere yet
    (node0,) = start_nodes(2, [SLEEPER, str(marks)], tmp_path, port=port, ranks=[0])
    nodes = [node0, node1]
    ready_pids(marks, 2)
    wait_for(lambda: (marks / "got-SIGUSR1-1").exists(), 30, "rank 1 to get the held SIGUSR1")
    for node in nodes:
        node.proc.send_signal(signal.SIGTERM)
    assert wait_all(nodes) == [2, 2]
    assert not (marks / "got-SIGUSR1-0").exists()
    envelope = same_envelopes(nodes)  # every node's forwards, each with its node
    (forward,) = envelope["forwarded_signals"]
    assert forward["signal"] == "SIGUSR1" and forward["ranks"] == [1]
    assert forward["node_rank"] == 1
    assert forward["held_since"] is not None and forward["held_since"] < forward["at"]


def test_scheduler_sigterm_to_every_supervisor_is_one_stop_a_second_kills(
        tmp_path: Path, marks: Path) -> None:
    """scancel signals every node's supervisor at once: one cause, one stop, no SIGKILL (the
    nodes' stops race; one is agreed and the other node applies it). Rank 0 ignores SIGTERM
    (a 60 s grace): a second SIGTERM, to node 1 only, kills it on node 0 at once. A rank
    ignoring SIGTERM killed at the stop's shared grace deadline: test_sigkill_to_node_1_*."""
    nodes = start_nodes(2, [SLEEPER, str(marks), "--ignore-term", "0"], tmp_path,
                        common=["--grace", "60"])
    pids = ready_pids(marks, 2)
    # At once: a test's two kill() calls are apart by as long as the test process is kept off
    # the CPU (on a loaded machine, long enough for node 0's stop to end node 1's rank before
    # node 1's SIGTERM is even sent). Stopped, both get their SIGTERM before either acts.
    for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGCONT):
        for node in nodes:
            node.proc.send_signal(sig)
    got_sigterm(marks, 2)

    def second_signal_killed_rank0() -> bool:  # again if the kernel made the two signals one
        if pid_alive(pids[0]):
            nodes[1].proc.send_signal(signal.SIGTERM)
            return False
        return True

    wait_for(second_signal_killed_rank0, 20, "rank 0 to be killed", step=0.5)
    assert wait_all(nodes, 30) == [2, 2]
    envelope = same_envelopes(nodes)
    requests = [(c["node_rank"], c["signal"], c["effect"]) for c in envelope["cancel_requests"]]
    # node 1's second request may come after its final envelope (its rank ended): not listed
    assert [(n, sig) for n, sig, _ in requests[:2]] == [(0, "SIGTERM"), (1, "SIGTERM")], requests
    assert "kill" not in [e for _, _, e in requests[:2]], requests  # one cause: no escalation
    for rank in range(2):
        assert stopped_by_supervisor(envelope, rank)
    assert envelope["stop"]["kind"] == "cancel" and envelope["stop"]["origin_node"] in (0, 1)
    assert envelope["cancelled"]["by"] == "SIGTERM to the supervisor"
    rank0 = next(r for r in envelope["ranks"] if r["rank"] == 0)
    assert rank0["signal"] == "SIGKILL"  # killed on node 0 by node 1's escalation
    assert [s["purpose"] for s in rank0["signals_sent"]] == ["stop", "kill"]  # one stop
    assert "second cancel" in rank0["signals_sent"][1]["reason"]
    no_orphans(pids)


@pytest.mark.fault("F34")
def test_sigkill_to_node_1_supervisor_is_node_lost(tmp_path: Path, marks: Path) -> None:
    """Three nodes: the two left agree on the verdict. Rank 2 ignores SIGTERM: node 2 kills
    it at the stop's shared grace deadline."""
    nodes = start_nodes(3, [SLEEPER, str(marks), "--ignore-term", "2"], tmp_path,
                        common=["--node-timeout", "2", "--grace", "1"])
    pids = ready_pids(marks, 3)
    nodes[1].proc.send_signal(signal.SIGKILL)
    assert nodes[1].wait() == -signal.SIGKILL
    codes = [nodes[0].wait(), nodes[2].wait()]
    assert codes == [2, 2]
    envelope = same_envelopes([nodes[0], nodes[2]])
    assert envelope["stop"]["kind"] == "node_lost" and envelope["stop"]["lost_node"] == 1
    assert envelope["decided_by"]["explanation"].startswith("root cause: node 1 was lost")
    assert envelope["agreement"]["nodes_lost"] == [1]
    assert [n["state"] for n in envelope["nodes"]] == ["done", "lost", "done"]
    rank2 = next(r for r in envelope["ranks"] if r["rank"] == 2)
    assert rank2["signal"] == "SIGKILL"
    assert [s["purpose"] for s in rank2["signals_sent"]] == ["stop", "kill"]
    assert "grace of 1 s ended" in rank2["signals_sent"][1]["reason"]
    no_orphans(pids)  # node 1's rank too: its guardian stops it when the supervisor dies


@pytest.mark.fault("F34")
def test_a_lost_node_is_the_cause_not_the_rank_its_loss_broke(tmp_path: Path,
                                                             marks: Path) -> None:
    """Two nodes, a gloo rank each, all-reducing. Node 1's supervisor is SIGKILLed: its
    guardian ends rank 1, and rank 0, mid-collective, fails at once with gloo's "Connection
    closed by peer", a node timeout before node 1 is declared lost. The verdict names node 1;
    rank 0's failure is its collateral (SPEC §10)."""
    nodes = start_nodes(2, [rank_script("gloo_loop.py"), str(marks)], tmp_path,
                        common=["--grace", "5", "--nproc-per-node", "1", "--node-timeout", "3"])
    ready_pids(marks, 2)
    nodes[1].proc.send_signal(signal.SIGKILL)
    assert nodes[1].wait() == -signal.SIGKILL
    assert nodes[0].wait() == 2
    envelope = nodes[0].envelope()
    assert envelope["stop"]["kind"] == "failure" and envelope["stop"]["origin_rank"] == 0
    decided = envelope["decided_by"]
    assert (decided["rule"], decided["rank"], decided["node"]) == (2, None, 1), decided
    assert decided["explanation"] == (
        "root cause: node 1 was lost (its supervisor went silent; its rank 1); rank 0 failed "
        "after it: collateral")
    assert envelope["root_cause_rank"] is None and envelope["collateral_ranks"] == [0]
    assert envelope["agreement"]["nodes_lost"] == [1]
    rank0 = envelope["ranks"][0]
    assert rank0["collateral"] is True and rank0["exit_code"] == 1
    tail = "\n".join(rank0["stderr_tail"] or [])
    assert "Connection closed by peer" in tail or "Connection reset by peer" in tail, tail


@pytest.mark.fault("F34")
def test_sigkill_to_node_0_supervisor(tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(2, [SLEEPER, str(marks)], tmp_path, common=["--node-timeout", "2"])
    pids = ready_pids(marks, 2)
    nodes[0].proc.send_signal(signal.SIGKILL)
    assert nodes[1].wait() == 2
    envelope = nodes[1].envelope()
    assert envelope["exit_code"] == 2
    assert envelope["agreement"]["agreed"] is False
    assert "decided without agreement" in envelope["agreement"]["note"]
    assert envelope["stop"]["kind"] == "node_lost"
    assert "node 0 lost" in envelope["stop"]["reason"]
    no_orphans(pids)


def test_a_refused_join_ends_every_node_with_1(tmp_path: Path) -> None:
    """Node 1 was given another --nnodes: it refuses, and node 0, waiting for the others, ends
    with the same reason. The join's other refusals (a duplicate node rank, a node that never
    joins within --join-timeout) are tested in-process in test_cluster_join.py."""
    port = free_port_pair()
    nodes = start_nodes(2, [EXIT_WITH, "0"], tmp_path, port=port, ranks=[0])
    nodes += start_nodes(3, [EXIT_WITH, "0"], tmp_path, port=port, ranks=[1])
    assert wait_all(nodes, 60) == [1, 1]
    reason = "--nnodes differs: node 0 has 2, this node 3"
    for node in nodes:
        out, err = node.output()
        assert reason in out, out + err
        assert "exit 1 EXIT_CONFIG_ERROR" in out
        assert reason in node.envelope()["error"]
