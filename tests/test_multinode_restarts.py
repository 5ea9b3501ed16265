"""--max-restarts across nodes (issue 25): one decision for the whole run, taken by node 0
from the agreed verdict; every node restarts its ranks together, or ends with the true code;
every node's envelope has the same ``attempts`` (each attempt dir is node-local). Real
supervisors on 127.0.0.1 (cluster_nodes.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import (
    Node,
    free_port_pair,
    no_orphans,
    same_envelopes,
    start_nodes,
    wait_all,
)
from conftest import cli_env, dies_with_the_test, rank_script, wait_for

pytestmark = pytest.mark.timeout(120)

CRASH = rank_script("crash_once.py")
FAST = ["--nproc-per-node", "2", "--restart-backoff", "0.2", "--grace", "5"]


def _attempts(envelope: dict[str, Any]) -> list[tuple[int, int, bool]]:
    return [(a["attempt"], a["exit_code"], a["restart"]["restarted"])
            for a in envelope["attempts"]]


def _same_attempts(nodes: list[Node]) -> list[dict[str, Any]]:
    """Every node's envelope alike, ``attempts`` included, but for each one's own dirs."""
    return [{k: v for k, v in a.items() if k != "run_dir"}
            for a in same_envelopes(nodes)["attempts"]]


def _all_pids(nodes: list[Node]) -> list[int]:
    return [int(r["pid"]) for a in nodes[0].envelope()["attempts"] for r in a["ranks"]
            if r.get("pid")]


def test_a_crash_on_node_1_restarts_every_node_together_then_the_run_succeeds(
        tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(2, [CRASH, str(marks), "3", "signal:11"], tmp_path,
                        common=[*FAST, "--max-restarts", "1"])
    codes = wait_all(nodes, 90)
    outputs = [n.output() for n in nodes]
    assert codes == [0, 0], outputs
    attempts = _same_attempts(nodes)
    assert [(a["attempt"], a["exit_code"]) for a in attempts] == [(0, 2), (1, 0)]
    assert attempts[0]["restart"] == {"restarted": True, "backoff_s": 0.2,
                                      "why": "restarting after rank 3 failed (killed by "
                                             "SIGSEGV)"}
    assert attempts[0]["ranks"][3]["signal"] == "SIGSEGV"
    assert attempts[1]["restart"] == {"restarted": False, "why": "the run succeeded",
                                      "backoff_s": None}
    for node in nodes:
        envelope = node.envelope()
        assert (envelope["exit_code"], envelope["restart_count"]) == (0, 1)
        assert envelope["agreement"]["agreed"] is True
        for rank in (2 * node.rank, 2 * node.rank + 1):
            for attempt, where in ((0, node.run_dir), (1, node.run_dir / "attempt-1")):
                assert (where / f"rank-{rank}.stdout.log").read_text() == (
                    f"rank {rank} attempt {attempt}\n")
        out = outputs[node.rank][0]
        assert "attempt 2/2, 2 nodes: restarting after rank 3 failed (killed by SIGSEGV); " \
               "starting in 0.2 s" in out
    for rank in range(4):  # torchrun's variables, as every restarted worker sees them
        assert (marks / f"env-{rank}-0").read_text() == "1"
        assert (marks / f"env-{rank}-1").read_text() == "1"
    no_orphans(_all_pids(nodes))


def test_an_outcome_on_one_node_is_never_restarted_on_any(tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(2, [CRASH, str(marks), "0", "exit:4", "always"], tmp_path,
                        common=[*FAST, "--max-restarts", "2"])
    assert wait_all(nodes, 90) == [4, 4], [n.output() for n in nodes]
    attempts = _same_attempts(nodes)
    assert [(a["attempt"], a["exit_code"], a["restart"]["restarted"]) for a in attempts] == [
        (0, 4, False)]
    assert attempts[0]["restart"]["why"] == ("exit 4 is the run's own outcome; a restart "
                                             "would not change it")
    assert (marks / "crashes").read_text() == "1"
    assert not any((n.run_dir / "attempt-1").exists() for n in nodes)


def test_a_cancel_during_the_backoff_on_one_node_ends_the_run_on_every_node(
        tmp_path: Path, marks: Path) -> None:
    nodes = start_nodes(2, [CRASH, str(marks), "3", "exit:9", "always"], tmp_path,
                        common=["--nproc-per-node", "2", "--grace", "5", "--max-restarts", "2",
                                "--restart-backoff", "60"])
    envelope = nodes[0].run_dir / "envelope.json"
    wait_for(lambda: envelope.exists() and b"restarting after" in envelope.read_bytes(), 60,
             "the backoff")
    nodes[1].proc.send_signal(signal.SIGINT)  # node 1's operator: Ctrl+C
    assert wait_all(nodes, 30) == [2, 2]  # the last attempt's verdict, at once
    attempts = _same_attempts(nodes)
    assert [(a["attempt"], a["exit_code"]) for a in attempts] == [(0, 2)]
    assert attempts[0]["restart"]["restarted"] is False
    assert attempts[0]["restart"]["why"] == ("cancelled during the backoff on node 1 by "
                                             "SIGINT to the supervisor")
    for node in nodes:
        cancelled = node.envelope()["cancelled"]
        assert (cancelled["by"], cancelled["signal"]) == ("SIGINT to the supervisor", "SIGINT")
        assert not (node.run_dir / "attempt-1").exists()
    assert (marks / "crashes").read_text() == "1"


def test_without_a_master_port_each_attempt_gets_a_free_one_from_node_0(
        tmp_path: Path, marks: Path) -> None:
    """torchrun's c10d rendezvous: node 0 picks rank 0's port for each round and publishes it
    (a restart never meets the port the old rank 0 held); --rdzv-endpoint gives only the
    control store's."""
    port = free_port_pair()
    nodes = []
    for rank in range(2):
        cmd = [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir",
               str(tmp_path / "run"), "--nnodes", "2", "--node-rank", str(rank),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", *FAST,
               "--max-restarts", "1", CRASH, str(marks), "0", "exit:7"]
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=dies_with_the_test)
        nodes.append(Node(rank, proc, tmp_path / "run"))
    assert wait_all(nodes, 90) == [0, 0], [n.output() for n in nodes]
    ports = [{(marks / f"port-{r}-{a}").read_text() for r in range(4)} for a in (0, 1)]
    assert all(len(p) == 1 for p in ports), ports  # every rank of an attempt: one port
    assert ports[0] != ports[1]
    assert nodes[1].envelope()["master_port"] == int(next(iter(ports[1])))
    no_orphans(_all_pids(nodes))


def test_a_node_that_never_joins_the_restart_ends_the_run_with_the_last_code(
        tmp_path: Path, marks: Path) -> None:
    """Node 1's supervisor is SIGKILLed during the backoff (its ranks had ended): node 0 waits
    for it at the restart's join until --join-timeout, then ends with the last attempt's code
    (never 1, never a hang), saying why the restart did not happen."""
    nodes = start_nodes(2, [CRASH, str(marks), "3", "exit:9", "always"], tmp_path,
                        common=["--nproc-per-node", "2", "--grace", "5", "--max-restarts", "2",
                                "--restart-backoff", "2", "--join-timeout", "20"])
    envelope = nodes[1].run_dir / "envelope.json"
    wait_for(lambda: envelope.exists() and b"restarting after" in envelope.read_bytes(), 60,
             "the backoff")
    nodes[1].proc.kill()
    assert nodes[0].wait(60) == 2
    out, _ = nodes[0].output()
    attempts = nodes[0].envelope()["attempts"]
    assert [(a["attempt"], a["exit_code"]) for a in attempts] == [(0, 2)]
    assert attempts[0]["restart"]["restarted"] is False
    assert attempts[0]["restart"]["why"] == ("the restart could not start: node 1 never joined "
                                             "within the join timeout of 20 s")
    assert "the restart could not start: node 1 never joined" in out
    assert not (nodes[0].run_dir / "attempt-1" / "rank-0.stdout.log").exists()
    no_orphans(_all_pids(nodes[:1]))


def test_node_0s_decision_travels_whole() -> None:
    """The record node 0 publishes: the agreed outcome, the decision, the backoff, the run's
    start, read back equal on every node."""
    from forgelm_tui.cluster.restart import ClosedAttempt
    from forgelm_tui.engine.restart_policy import RestartDecision
    from forgelm_tui.session.outcome import NodeOutcome, Restarts, RunFrame, RunOutcome
    from forgelm_tui.verdict import Verdict

    verdict = Verdict(2, "EXIT_TRAINING_ERROR", "training error", "retry", 2,
                      "root cause: rank 3 failed on its own (exit 9)", 3)
    outcome = RunOutcome(verdict, RunFrame(1.0, 2.0, restarts=Restarts(2, 1)),
                         (NodeOutcome(0, "a"), NodeOutcome(1, "b")))
    closed = ClosedAttempt(outcome, RestartDecision(True, "restarting after rank 3 failed"),
                           0.4, 0.5)
    again = ClosedAttempt.from_wire(json.loads(json.dumps(closed.to_wire())))
    assert again == closed and again.attempt == 1


# ---------------------------------------------------------------------- elastic (MIN:MAX)

ELASTIC = rank_script("elastic_rank.py")


def elastic_nodes(count: int, nnodes: str, tmp_path: Path, marks: Path,
                  *extra: str, rank_args: tuple[str, ...] = ()) -> list[Node]:
    """``count`` supervisors of one elastic run, last call 2 s: the first (index 0) hosts the
    store (--node-rank 0), the others join without a node rank (c10d). The others start first
    and node 0 once they have imported torch: they wait for its store and join within
    milliseconds of it, so the first round closes at MAX, not at MIN after the last call (a
    node slower than the last call would be too late for the round: that is the rule)."""
    port = free_port_pair()
    nodes: list[Node] = []
    for index in [*range(1, count), 0]:
        own = ["--node-rank", "0", "--rdzv-conf", "last_call_timeout=2"] if index == 0 else [
            "--rdzv-conf", "last_call_timeout=2,is_host=0"]
        if index == 0:
            wait_for(lambda: all(_torch_loaded(n.proc.pid) for n in nodes), 60,
                     "the other nodes to import torch")
        cmd = [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir",
               str(tmp_path / "run"), "--nnodes", nnodes, "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", "2",
               "--node-timeout", "3", "--grace", "5", "--restart-backoff", "0.2", *own,
               *extra, ELASTIC, str(marks), *rank_args]
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=dies_with_the_test)
        nodes.append(Node(index, proc, tmp_path / "run"))
    return sorted(nodes, key=lambda n: n.rank)  # index 0 first: the host


def _torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def own_envelope(node: Node) -> dict[str, Any]:
    """A node's envelope, found by its supervisor's pid: an elastic node's dir is named by its
    node id (its node rank in the first attempt: the order of joining), not by its index."""
    for path in sorted(node.root.glob("node-*/envelope.json")):
        envelope = json.loads(path.read_text())
        if envelope["nodes"][envelope["node_rank"]]["pid"] == node.proc.pid:
            return envelope
    raise AssertionError(f"no envelope of pid {node.proc.pid}")


def test_an_elastic_run_that_loses_a_node_goes_on_with_the_others(
        tmp_path: Path, marks: Path) -> None:
    """--nnodes 2:3, three nodes, a non-hosting one's supervisor SIGKILLed mid-run: node 0
    declares it lost, and with 2 >= MIN nodes left the run restarts with them (WORLD_SIZE 4,
    node ranks 0 and 1) and ends 0; both envelopes have both attempts and their memberships."""
    nodes = elastic_nodes(3, "2:3", tmp_path, marks, "--max-restarts", "2")
    wait_for(lambda: len(list(marks.glob("0-*"))) == 6, 60, "six ranks of the first attempt")
    nodes[2].proc.kill()
    survivors = nodes[:2]
    codes = [n.wait(90) for n in survivors]
    outputs = [n.output() for n in survivors]
    assert codes == [0, 0], outputs
    assert sorted(p.name for p in marks.glob("1-*")) == ["1-0", "1-1", "1-2", "1-3"]
    for rank in range(4):
        world, group, groups, _, _ = (marks / f"1-{rank}").read_text().split()
        assert (world, group, groups) == ("4", str(rank // 2), "2")
    assert all("attempt 2/3: 2 nodes, WORLD_SIZE 4" in out for out, _ in outputs)
    envelopes = [own_envelope(n) for n in survivors]
    for envelope in envelopes:
        first, second = envelope["attempts"]
        assert (first["nnodes"], first["world_size"], second["nnodes"],
                second["world_size"]) == (3, 6, 2, 4)
        assert first["restart"]["restarted"] is True, first["restart"]
        assert first["restart"]["why"].startswith("restarting with 2 node(s) after node ")
        assert [n["state"] for n in first["nodes"]].count("lost") == 1
        assert second["exit_code"] == 0 and envelope["exit_code"] == 0
        assert second["run_dir"] == f"{Path(envelope['run_dir'])}/attempt-1"
    strip = [[{k: v for k, v in a.items() if k != "run_dir"} for a in e["attempts"]]
             for e in envelopes]
    assert strip[0] == strip[1]
    no_orphans([int(r["pid"]) for e in envelopes for a in e["attempts"] for r in a["ranks"]
                if r.get("pid")])


@pytest.mark.parametrize(("nnodes", "killed", "why"), [
    ("3:3", 1, "not a failure a restart can fix (node "),  # a fixed count: nothing replaces it
    ("2:3", 2, "node(s) left, fewer than the 2 --nnodes needs"),
])
def test_a_run_left_without_enough_nodes_ends_with_2_naming_the_lost_one(
        tmp_path: Path, marks: Path, nnodes: str, killed: int, why: str) -> None:
    nodes = elastic_nodes(3, nnodes, tmp_path, marks, "--max-restarts", "2")
    wait_for(lambda: len(list(marks.glob("0-*"))) == 6, 60, "six ranks of the first attempt")
    for node in nodes[3 - killed:]:
        node.proc.kill()
    assert nodes[0].wait(90) == 2
    envelope = own_envelope(nodes[0])
    (attempt,) = envelope["attempts"]
    assert attempt["restart"]["restarted"] is False
    assert why in attempt["restart"]["why"], attempt["restart"]
    assert envelope["root_cause_node"] in (1, 2)
    assert envelope["stop"]["kind"] == "node_lost"
    for node in nodes[1:3 - killed]:
        assert node.wait(60) == 2


def test_losing_node_0_of_an_elastic_run_ends_it_with_2_decided_without_agreement(
        tmp_path: Path, marks: Path) -> None:
    """Node 0 hosts the control store: without it no node can decide a restart."""
    nodes = elastic_nodes(3, "2:3", tmp_path, marks, "--max-restarts", "2")
    wait_for(lambda: len(list(marks.glob("0-*"))) == 6, 60, "six ranks of the first attempt")
    nodes[0].proc.kill()
    assert [n.wait(90) for n in nodes[1:]] == [2, 2]
    envelopes = [json.loads(p.read_text()) for p in tmp_path.glob("run/node-[12]/envelope.json")]
    assert len(envelopes) == 2
    for envelope in envelopes:
        assert envelope["exit_code"] == 2
        assert envelope["agreement"]["agreed"] is False
        assert "decided without agreement" in envelope["agreement"]["note"]
    assert not list(marks.glob("1-*"))  # nothing restarted


def test_a_node_that_arrives_while_an_elastic_run_goes_joins_the_next_round(
        tmp_path: Path, marks: Path) -> None:
    """--nnodes 2:3 started on two nodes (the round closes at MIN after the 2 s last call), a
    third arrives while the ranks run: it waits for the next round, node 0 stops the run to
    re-form it (kind ``membership``, not counted: --max-restarts 0), and the run goes on with
    three nodes (WORLD_SIZE 6, TORCHELASTIC_RESTART_COUNT still 0) and ends 0 everywhere."""
    nodes = elastic_nodes(2, "2:3", tmp_path, marks, rank_args=("6",))
    wait_for(lambda: len(list(marks.glob("w4-*"))) == 4, 60, "four ranks of the first round")
    late = late_node(nodes[0], tmp_path, marks)
    codes = [n.wait(90) for n in [*nodes, late]]
    outputs = [n.output() for n in [*nodes, late]]
    assert codes == [0, 0, 0], outputs
    assert sorted(p.name for p in marks.glob("w6-*")) == [f"w6-{r}" for r in range(6)]
    assert all((marks / f"w6-{r}").read_text().split()[4] == "0" for r in range(6))
    first = own_envelope(nodes[0])
    assert [(a["attempt"], a["nnodes"], a["restart"]["restarted"]) for a in
            first["attempts"]] == [(0, 2, True), (1, 3, False)]
    assert first["attempts"][0]["stop"]["kind"] == "membership"
    assert first["attempts"][0]["restart"]["why"].startswith("re-forming the run: a node is "
                                                             "waiting to join")
    joined = own_envelope(late)  # it took part in the second attempt only
    assert [a["attempt"] for a in joined["attempts"]] == [1]
    assert joined["run_dir"].endswith("node-2") and joined["world_size"] == 6
    assert "waiting for the next one" in outputs[2][0]
    assert "attempt 2/2: re-forming the run: a node is waiting to join" in outputs[0][0]
    assert "attempt 2/2: 3 nodes, WORLD_SIZE 6" in outputs[0][0]


def late_node(host: Node, tmp_path: Path, marks: Path, *extra: str) -> Node:
    """A third supervisor of the run ``host`` began (its command line, is_host=0)."""
    args = [str(a) for a in host.proc.args]  # type: ignore[union-attr]
    at = args.index("--node-rank")
    cmd = [a if a != "last_call_timeout=2" else "last_call_timeout=2,is_host=0"
           for a in args[:at] + list(extra) + args[at + 2:]]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=dies_with_the_test)
    return Node(2, proc, tmp_path / "run")


def test_a_node_arriving_when_an_elastic_run_has_max_nodes_gives_up_at_its_join_timeout(
        tmp_path: Path, marks: Path) -> None:
    """--nnodes 1:2 on two nodes: a third is too late and node 0 has MAX already; it waits
    for a round that does not come until its --join-timeout, exits 1 with one line, and the
    run goes on untouched."""
    nodes = elastic_nodes(2, "1:2", tmp_path, marks, rank_args=("6",))
    wait_for(lambda: len(list(marks.glob("w4-*"))) == 4, 60, "four ranks of the first round")
    late = late_node(nodes[0], tmp_path, marks, "--join-timeout", "4")
    assert late.wait(60) == 1
    out, err = late.output()
    assert "waiting for the next one" in out + err
    assert "no new round of the run began for this node" in out + err
    assert "Traceback" not in out + err
    assert all(n.proc.poll() is None for n in nodes)  # untouched
    for node in nodes:
        node.proc.send_signal(signal.SIGTERM)
    assert [n.wait(60) for n in nodes] == [2, 2]
    assert own_envelope(nodes[0])["stop"]["kind"] == "cancel"


def test_an_attached_viewer_follows_every_nodes_restart_on_one_connection(
        tmp_path: Path, marks: Path) -> None:
    """A viewer attached to node 0 sees the restart (its attempt), the new attempt's ranks on
    both nodes and the run's verdict, without attaching again."""
    from forgelm_tui.control.client import ControlClient, ControlError
    from forgelm_tui.engine import events as ev

    nodes = start_nodes(2, [CRASH, str(marks), "3", "exit:9"], tmp_path,
                        common=["--nproc-per-node", "2", "--grace", "5", "--max-restarts", "1",
                                "--restart-backoff", "2"])
    sock = nodes[0].run_dir / "control.sock"
    wait_for(sock.exists, 60, "node 0's control socket")
    client = ControlClient(sock)
    items: list[Any] = []
    try:
        while not any(isinstance(i, ev.VerdictReached) for i in items):
            items.append(client.next_item())
    except ControlError:
        pass
    finally:
        client.close()
    assert wait_all(nodes, 60) == [0, 0]
    restarted = next(n for n, i in enumerate(items) if (
        isinstance(i, ev.AttemptStarted) and i.attempt == 1) or (
        isinstance(i, ev.RunSnapshot) and i.attempt is not None and i.attempt.attempt == 1))
    later = items[restarted:]
    assert {i.rank for i in later if isinstance(i, ev.RankStarted)} == {0, 1}
    assert any(isinstance(i, ev.NodeChanged) and i.node_rank == 1 and i.ranks for i in later)
    verdict = next(i for i in later if isinstance(i, ev.VerdictReached))
    assert verdict.verdict.code == 0


def test_a_lost_node_that_broke_a_collective_first_is_never_restarted_with_a_fixed_count(
        tmp_path: Path, marks: Path) -> None:
    """Two nodes, a gloo rank each, --max-restarts 2: node 1's supervisor SIGKILLed, rank 0
    fails first ("Connection closed by peer"), the agreed stop is a failure, but the verdict
    names node 1's loss: no restart (nothing would replace node 1; a restart would wait for it
    until --join-timeout). The run ends 2 at once."""
    from test_multinode import ready_pids

    nodes = start_nodes(2, [rank_script("gloo_loop.py"), str(marks)], tmp_path,
                        common=["--grace", "5", "--nproc-per-node", "1", "--node-timeout", "3",
                                "--max-restarts", "2", "--restart-backoff", "0.2"])
    ready_pids(marks, 2)
    nodes[1].proc.send_signal(signal.SIGKILL)
    assert nodes[0].wait(60) == 2
    (attempt,) = nodes[0].envelope()["attempts"]
    assert attempt["restart"]["restarted"] is False
    assert attempt["restart"]["why"].startswith("not a failure a restart can fix (node 1 "
                                                "lost"), attempt["restart"]
    assert not (nodes[0].run_dir / "attempt-1").exists()
