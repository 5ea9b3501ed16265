"""Eight real supervisors on 127.0.0.1 (issue 23): the join, a failure's fan-out to every rank on
every node, every node's true code and envelope, nothing left running. Torch-free ranks (the
bench's stepper); each supervisor imports torch for the store (SPEC §8), which is most of the
test's time. The figures at 2-32 nodes are bench/scale.py's (bench/RESULTS.md)."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path

import pytest
from cluster_nodes import no_orphans, same_envelopes, start_nodes, wait_all
from conftest import wait_for

from forgelm_tui.control.client import ControlClient, ControlError
from forgelm_tui.engine import events as ev

STEPPER = str(Path(__file__).parent.parent / "bench" / "ranks" / "stepper.py")
NODES = 8

pytestmark = pytest.mark.timeout(120)


def test_eight_nodes_join_and_a_failure_on_the_last_stops_every_rank(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    nodes = start_nodes(NODES, [STEPPER, str(marks), "120", "2"], tmp_path,
                        common=["--nproc-per-node", "1", "--join-timeout", "90",
                                "--node-timeout", "30"])
    try:
        wait_for(lambda: len(list(marks.glob("ready-*"))) == NODES
                 or any(n.proc.poll() is not None for n in nodes), 90, "every rank to start")
        assert all(n.proc.poll() is None for n in nodes), [n.output() for n in nodes]
        rows_and_one_opened_node(nodes[0].run_dir / "control.sock", opened=3)
        (marks / "fail").touch()  # the last rank (node 7's) exits 2 at once
        codes = wait_all(nodes, 60)
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()
    outputs = [node.output() for node in nodes]
    assert codes == [2] * NODES, outputs
    envelope = same_envelopes(nodes)
    failed_at = float((marks / "failed-at").read_text())
    assert envelope["exit_code"] == 2 and envelope["root_cause_rank"] == NODES - 1
    assert envelope["root_cause_node"] == NODES - 1  # one rank a node: its own node
    assert [n["node_rank"] for n in envelope["nodes"]] == list(range(NODES))
    signalled = {}
    for rank in envelope["ranks"][:-1]:
        stops = [s for s in rank["signals_sent"] if s["purpose"] == "stop"]
        assert stops, f"rank {rank['rank']} was never signalled"
        signalled[rank["rank"]] = datetime.fromisoformat(stops[0]["at"]).timestamp() - failed_at
    assert sorted(signalled) == list(range(NODES - 1))
    assert all(delay >= 0 for delay in signalled.values()), signalled
    # every rank signalled well within the node timeout: by the broadcast, not by a lost node
    assert max(signalled.values()) < 15, signalled
    no_orphans([pid for node in nodes for pid in node.rank_pids()])
    for _, err in outputs:
        assert "Traceback" not in err



def rows_and_one_opened_node(socket: Path, opened: int) -> None:
    """A viewer attached to node 0 that opened one node (``watch``, docs/control.md): every
    other node sends its row (its summary, no rank but those that need reading), the opened
    one its ranks too (cluster/views.py), through the real store."""
    client = ControlClient(socket, output="tail")
    client.send("watch", nodes=[opened])
    seen: dict[int, list[ev.NodeChanged]] = {}

    def read() -> None:
        try:
            while True:
                item = client.next_item()
                if isinstance(item, ev.NodeChanged) and item.summary is not None:
                    seen.setdefault(item.node_rank, []).append(item)
        except (ControlError, OSError, ValueError):
            return

    threading.Thread(target=read, daemon=True).start()
    try:
        wait_for(lambda: set(seen) == set(range(1, NODES)) and any(
            c.complete and c.ranks for c in seen[opened]), 30, "every node's row, one's ranks")
    finally:
        client.close()
    for node, changes in dict(seen).items():
        assert all(c.summary is not None and c.summary.ranks == 1 for c in changes), node
        if node != opened:  # a running rank needs no reading: a row alone
            assert all(not c.complete and c.ranks == () for c in changes), (node, changes)
