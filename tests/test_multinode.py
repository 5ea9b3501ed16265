"""Multi-node (SPEC §8) with real supervisors: three "nodes" on 127.0.0.1, one forgelm-tui each,
agreeing through the TCPStore node 0 hosts. One stop, one verdict, every node the same code."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import Node, free_port_pair, no_orphans, start_nodes, wait_all
from conftest import rank_script, ready_pids, wait_for

pytestmark = pytest.mark.timeout(150)

SLEEPER = rank_script("sleeper.py")
EXIT_WITH = rank_script("exit_with.py")
NODE_LOCAL = {"node_rank", "run_dir", "command"}


def same_envelopes(nodes: list[Node]) -> dict[str, Any]:
    """Every node wrote the same envelope, but for the documented node-local fields."""
    envelopes = [n.envelope() for n in nodes]
    first = {k: v for k, v in envelopes[0].items() if k not in NODE_LOCAL}
    for node, envelope in zip(nodes, envelopes, strict=True):
        assert envelope["node_rank"] == node.rank
        assert envelope["run_dir"] == str(node.run_dir)
        assert {k: v for k, v in envelope.items() if k not in NODE_LOCAL} == first
    return envelopes[0]


def stopped_by_supervisor(envelope: dict[str, Any], rank: int) -> bool:
    entry = next(r for r in envelope["ranks"] if r["rank"] == rank)
    return any(s["purpose"] == "stop" and s["signal"] == "SIGTERM" for s in entry["signals_sent"])


def test_all_succeed_zero_everywhere(tmp_path: Path) -> None:
    nodes = start_nodes(3, [EXIT_WITH, "0"], tmp_path)
    assert wait_all(nodes) == [0, 0, 0]
    envelope = same_envelopes(nodes)
    assert envelope["world_size"] == 3 and envelope["nnodes"] == 3
    assert [r["rank"] for r in envelope["ranks"]] == [0, 1, 2]
    assert [r["node_rank"] for r in envelope["ranks"]] == [0, 1, 2]
    assert [n["state"] for n in envelope["nodes"]] == ["done"] * 3
    assert envelope["agreement"] == {"agreed": True, "decided_by_node": 0, "nodes_lost": []}
    assert envelope["stop"] is None
    out, _ = nodes[0].output()
    assert "node 2 (" in out and "rank 2 on node 2 exited with 0" in out


def test_rank0_awaiting_approval_is_4_on_every_node(tmp_path: Path) -> None:
    nodes = start_nodes(3, [EXIT_WITH, "0", "0=4", "--sleep-rank", "0=0.5"], tmp_path)
    assert wait_all(nodes) == [4, 4, 4]
    envelope = same_envelopes(nodes)
    assert envelope["exit_name"] == "EXIT_AWAITING_APPROVAL"
    assert envelope["decided_by"]["rank"] == 0 and envelope["decided_by"]["rule"] == 3


def test_rank_on_node_2_fails_mid_run(tmp_path: Path, marks: Path) -> None:
    """Ranks in a gloo barrier; rank 2 (node 2) exits 2: every node stops and exits 2."""
    nodes = start_nodes(3, [rank_script("gloo_barrier.py"), "2", "2"], tmp_path)
    assert wait_all(nodes) == [2, 2, 2]
    envelope = same_envelopes(nodes)
    assert envelope["decided_by"] == {"rule": 2, "rank": 2,
                                      "explanation": "root cause: rank 2 failed on its own "
                                                     "(exit 2)"}
    assert envelope["root_cause_rank"] == 2
    assert envelope["stop"]["origin_node"] == 2 and envelope["stop"]["kind"] == "failure"
    for node in nodes:
        out, _ = node.output()
        assert "root cause: rank 2 failed on its own (exit 2)" in out
    no_orphans([p for n in nodes for p in n.rank_pids()])


def test_sigterm_to_one_supervisor_stops_every_node(tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(3, [SLEEPER, str(marks)], tmp_path)
    pids = ready_pids(marks, 3)
    nodes[1].proc.send_signal(signal.SIGTERM)
    assert wait_all(nodes) == [2, 2, 2]
    envelope = same_envelopes(nodes)
    for rank in range(3):
        assert (marks / f"got-SIGTERM-{rank}").exists()
        assert stopped_by_supervisor(envelope, rank)
    assert envelope["stop"]["kind"] == "cancel" and envelope["stop"]["origin_node"] == 1
    assert envelope["cancelled"]["by"] == "SIGTERM to the supervisor"
    no_orphans(pids)


def test_scheduler_sigterm_to_every_supervisor_is_one_stop(tmp_path: Path, marks: Path) -> None:
    """scancel signals every node's supervisor at once: one cause, one stop, no SIGKILL."""
    nodes = start_nodes(3, [SLEEPER, str(marks), "--ignore-term", "1"], tmp_path,
                        common=["--grace", "4"])
    pids = ready_pids(marks, 3)
    for node in nodes:
        node.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    wait_for(lambda: all((marks / f"got-SIGTERM-{r}").exists() for r in range(3)), 20,
             "every rank to get SIGTERM")
    assert wait_all(nodes) == [2, 2, 2]
    assert time.monotonic() - t0 > 3  # the grace held: nobody escalated
    envelope = same_envelopes(nodes)
    effects = [c["effect"] for c in envelope["cancel_requests"]]
    assert effects.count("kill") == 0, envelope["cancel_requests"]
    rank1 = next(r for r in envelope["ranks"] if r["rank"] == 1)
    assert rank1["signal"] == "SIGKILL"  # it ignored SIGTERM: killed at the grace deadline
    no_orphans(pids)


def test_second_signal_escalates_everywhere(tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(2, [SLEEPER, str(marks), "--ignore-term", "0"], tmp_path,
                        common=["--grace", "60"])
    pids = ready_pids(marks, 2)
    nodes[1].proc.send_signal(signal.SIGTERM)
    wait_for(lambda: (marks / "got-SIGTERM-0").exists(), 20, "rank 0 to get SIGTERM")
    nodes[1].proc.send_signal(signal.SIGTERM)
    assert wait_all(nodes, 30) == [2, 2]
    envelope = same_envelopes(nodes)
    rank0 = next(r for r in envelope["ranks"] if r["rank"] == 0)
    assert rank0["signal"] == "SIGKILL"  # killed on node 0 by node 1's escalation
    assert any("second cancel" in s["reason"] for s in rank0["signals_sent"])
    no_orphans(pids)


def test_sigterm_ignoring_rank_killed_at_the_shared_deadline(tmp_path: Path,
                                                            marks: Path) -> None:
    port = free_port_pair()
    target = [SLEEPER, str(marks), "--ignore-term", "2"]
    nodes = start_nodes(3, target, tmp_path, port=port, common=["--grace", "2"], ranks=[1, 2])
    nodes[:0] = start_nodes(3, [EXIT_WITH, "2", "--sleep", "1.5"], tmp_path, port=port,
                            common=["--grace", "2"], ranks=[0])
    assert wait_all(nodes) == [2, 2, 2]
    envelope = same_envelopes(nodes)
    assert envelope["decided_by"]["rank"] == 0
    rank2 = next(r for r in envelope["ranks"] if r["rank"] == 2)
    assert rank2["signal"] == "SIGKILL"
    assert [s["purpose"] for s in rank2["signals_sent"]] == ["stop", "kill"]
    assert "grace of 2 s ended" in rank2["signals_sent"][1]["reason"]
    no_orphans([p for n in nodes for p in n.rank_pids()])


@pytest.mark.fault("F34")
def test_sigkill_to_node_1_supervisor_is_node_lost(tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(3, [SLEEPER, str(marks)], tmp_path, common=["--node-timeout", "2"])
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
    no_orphans(pids)  # node 1's rank too: its guardian stops it when the supervisor dies


@pytest.mark.fault("F34")
def test_sigkill_to_node_0_supervisor(tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(3, [SLEEPER, str(marks)], tmp_path, common=["--node-timeout", "2"])
    pids = ready_pids(marks, 3)
    nodes[0].proc.send_signal(signal.SIGKILL)
    assert [nodes[1].wait(), nodes[2].wait()] == [2, 2]
    for node in nodes[1:]:
        envelope = node.envelope()
        assert envelope["exit_code"] == 2
        assert envelope["agreement"]["agreed"] is False
        assert "decided without agreement" in envelope["agreement"]["note"]
        assert envelope["stop"]["kind"] == "node_lost"
        assert "node 0 lost" in envelope["stop"]["reason"]
    no_orphans(pids)


def test_duplicate_node_rank_refused_everywhere(tmp_path: Path) -> None:
    port = free_port_pair()
    nodes = start_nodes(3, [EXIT_WITH, "0"], tmp_path, port=port, ranks=[0, 1])
    (tmp_path / "dup").mkdir()
    dup = start_nodes(3, [EXIT_WITH, "0"], tmp_path / "dup", port=port, ranks=[1])
    assert wait_all([*nodes, *dup], 60) == [1, 1, 1]
    for node in [*nodes, *dup]:
        out, err = node.output()
        assert "node rank 1 joined twice" in out, out + err
        assert "exit 1 EXIT_CONFIG_ERROR" in out


def test_node_that_never_joins(tmp_path: Path) -> None:
    import re

    nodes = start_nodes(3, [EXIT_WITH, "0"], tmp_path, ranks=[0, 1],
                        common=["--join-timeout", "8"])
    assert wait_all(nodes, 60) == [1, 1]
    # node 2 is named; on a loaded machine node 1 may also have been too slow to join
    missing = re.compile(r"nodes? (1, )?2 never joined within the join timeout of 8 s")
    for node in nodes:
        out, err = node.output()
        assert missing.search(out), out + err
        assert missing.match(node.envelope()["error"])


def test_stall_across_nodes(tmp_path: Path) -> None:
    """A rank on node 1 stops taking part; the others block in the all-reduce: no rank on any
    node progresses -> stalled, 2 everywhere."""
    nodes = start_nodes(3, ["demo", "--hang-rank", "1", "--hang-step", "3", "--steps", "50"],
                        tmp_path, common=["--stall-timeout", "4", "--grace", "3"])
    assert wait_all(nodes, 120) == [2, 2, 2]
    envelope = same_envelopes(nodes)
    assert envelope["stop"]["kind"] == "stall"
    assert envelope["decided_by"]["rule"] == 4
    no_orphans([p for n in nodes for p in n.rank_pids()])


def test_drain_after_rank0_covers_every_node(tmp_path: Path, marks: Path) -> None:
    """Rank 0 (node 0) ends with 4; rank 1 on node 1 runs on: after the drain window node 0
    stops it (node 0 has no rank left, its drain timer still runs) and the run is 4."""
    port = free_port_pair()
    rest = start_nodes(2, [SLEEPER, str(marks)], tmp_path, port=port, ranks=[1],
                       common=["--drain", "2"])
    first = start_nodes(2, [EXIT_WITH, "4", "--sleep", "1"], tmp_path, port=port, ranks=[0],
                        common=["--drain", "2"])
    nodes = [*first, *rest]
    assert wait_all(nodes) == [4, 4]
    envelope = same_envelopes(nodes)
    assert envelope["stop"]["kind"] == "drain" and envelope["stop"]["origin_node"] == 0
    assert envelope["decided_by"]["rule"] == 3
    assert stopped_by_supervisor(envelope, 1)


def test_slurm_step_configures_every_node(tmp_path: Path) -> None:
    """Inside a (fake) srun step with no multi-node flag: node count, node rank, master address
    (expanded by a stub scontrol) and run id come from SLURM's environment."""
    import os
    import subprocess
    import sys

    from conftest import cli_env

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "scontrol"
    stub.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames fake[01-02]" ] || exit 1\n'
                    'printf "127.0.0.1\\nfake02\\n"\n')
    stub.chmod(0o755)
    port = free_port_pair()
    procs = []
    for node in (0, 1):
        env = cli_env({"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
                       "SLURM_STEP_ID": "3", "SLURM_PROCID": str(node),
                       "SLURM_NODEID": str(node), "SLURM_STEP_NUM_NODES": "2",
                       "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                       "SLURM_STEP_NODELIST": "fake[01-02]"})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "forgelm_tui", "--no-tui", "--master-port", str(port),
             "--run-dir", str(tmp_path / "run"), EXIT_WITH, "0", "0=4"], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True))
    nodes = [Node(n, p, tmp_path / "run") for n, p in enumerate(procs)]
    assert wait_all(nodes) == [4, 4]
    envelope = same_envelopes(nodes)
    assert envelope["run_id"] == "slurm-4242.3"
    assert envelope["nnodes"] == 2 and envelope["master_addr"] == "127.0.0.1"
