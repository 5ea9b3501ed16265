"""Several "nodes" on 127.0.0.1: one real forgelm-tui supervisor each, as SPEC §8 runs them."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import cli_env, dies_with_the_test, pid_alive, wait_for


def free_port_pair() -> int:
    """A port P with P and P+1 both free (rank 0's store and the control store), below the
    kernel's ephemeral range (32768-60999 here): the ports the kernel hands out meanwhile (a
    connection's own end, a port node 0 picks for a restart's rank 0) never take it between
    this check and the node that binds it. Random, so that parallel tests rarely meet."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(20000, 32000)
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("", port))
                second.bind(("", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no free pair of ports")


@dataclass
class Node:
    rank: int
    proc: subprocess.Popen[str]
    root: Path  # --run-dir; this node writes root/node-<rank>

    @property
    def run_dir(self) -> Path:
        return self.root / f"node-{self.rank}"

    def envelope(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "envelope.json").read_text())

    def wait(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise

    def output(self) -> tuple[str, str]:
        return self.proc.communicate(timeout=30)

    def rank_pids(self) -> list[int]:
        return [int(r["pid"]) for r in self.envelope()["ranks"] if r.get("pid")]


def start_nodes(nnodes: int, target: Sequence[str], tmp_path: Path, *,
                extra: Sequence[Sequence[str]] = (), common: Sequence[str] = (),
                env: dict[str, str] | None = None, port: int | None = None,
                ranks: Sequence[int] | None = None) -> list[Node]:
    """Start one supervisor per node (``ranks``: which node ranks to start, default all),
    ``--nnodes N --node-rank i --master-addr 127.0.0.1 --master-port P`` + ``common`` +
    ``extra[i]``, then ``target`` (a script and its arguments, or ``demo ...``)."""
    port = port or free_port_pair()
    nodes = []
    for rank in (range(nnodes) if ranks is None else ranks):
        own = list(extra[rank]) if rank < len(extra) else []
        cmd = [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir",
               str(tmp_path / "run"), "--nnodes", str(nnodes), "--node-rank", str(rank),
               "--master-addr", "127.0.0.1", "--master-port", str(port), *common, *own,
               *target]
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=dies_with_the_test)
        nodes.append(Node(rank, proc, tmp_path / "run"))
    return nodes


NODE_LOCAL = {"node_rank", "run_dir", "command"}


def _shared(envelope: dict[str, Any]) -> dict[str, Any]:
    """An envelope without its node-local fields (each attempt's run dir is one too)."""
    shared = {k: v for k, v in envelope.items() if k not in NODE_LOCAL}
    shared["attempts"] = [{k: v for k, v in a.items() if k != "run_dir"}
                          for a in envelope.get("attempts", [])]
    return shared


def same_envelopes(nodes: Sequence[Node]) -> dict[str, Any]:
    """Every node wrote the same envelope, but for the documented node-local fields."""
    envelopes = [n.envelope() for n in nodes]
    first = _shared(envelopes[0])
    for node, envelope in zip(nodes, envelopes, strict=True):
        assert envelope["node_rank"] == node.rank
        assert envelope["run_dir"] == str(node.run_dir)
        for attempt in envelope.get("attempts", []):
            assert attempt["run_dir"] == str(node.run_dir if attempt["attempt"] == 0 else
                                             node.run_dir / f"attempt-{attempt['attempt']}")
        mine = _shared(envelope)
        assert mine == first, {k: (first.get(k), mine.get(k)) for k in {*first, *mine}
                               if first.get(k) != mine.get(k)}
    return envelopes[0]


def wait_all(nodes: Sequence[Node], timeout: float = 90) -> list[int]:
    return [node.wait(timeout) for node in nodes]


def no_orphans(pids: Sequence[int]) -> None:
    wait_for(lambda: not any(pid_alive(p) for p in pids), 15, f"ranks {list(pids)} to be gone")
