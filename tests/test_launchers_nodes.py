"""A launcher's multi-node command behind forgelm-tui on every node (issue 26): DeepSpeed's
``--no_ssh --node_rank N`` (each node started by a scheduler, as srun does) and accelerate's
``--num_machines/--machine_rank/--main_process_ip``. Two "nodes" on 127.0.0.1, the launchers'
own pair beside forgelm-tui's (other ports): every rank's arguments and environment are
theirs but for the listed differences, and every node returns the run's true code where the
launchers return it on one node only (accelerate: 1 there)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cluster_nodes import free_port_pair
from conftest import cli_env, dies_with_the_test
from test_launchers_real import ACCELERATE, DEEPSPEED, DUMP, WORDS, assert_same, forgelm_tui

pytestmark = pytest.mark.timeout(180)


def two_nodes(tmp_path: Path, launcher: list[str], node_args: str, args: list[str]) -> tuple[
        list[int], list[int], dict[str, dict], dict[str, dict]]:
    """``node_args`` is formatted with {rank} and {port} for each node."""
    env = {"HF_HOME": str(tmp_path / "hf"), "ACCELERATE_USE_CPU": "true", "DUMP_EXIT": "0=4"}
    procs = []
    for name, port in (("own", free_port_pair()), ("mine", free_port_pair())):
        dump = tmp_path / name
        dump.mkdir()
        for rank in range(2):
            extra = node_args.format(rank=rank, port=port).split()
            cmd = ([*launcher, *extra, *args] if name == "own" else
                   forgelm_tui(tmp_path / f"node{rank}", *WORDS[launcher[0]], *extra, *args))
            procs.append(subprocess.Popen(
                cmd, cwd=tmp_path, env=cli_env({**env, "DUMP_DIR": str(dump)}), text=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=dies_with_the_test))
    outputs = [p.communicate(timeout=150)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert not any("Traceback" in out for out in outputs[2:]), outputs[2:]
    dumps = [{p.stem: json.loads(p.read_text()) for p in (tmp_path / n).glob("rank-*.json")}
             for n in ("own", "mine")]
    return codes[:2], codes[2:], dumps[0], dumps[1]


def test_deepspeed_no_ssh_nodes_are_one_run(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("node-a slots=2\nnode-b slots=2\n")
    own, mine, theirs, ours = two_nodes(
        tmp_path, DEEPSPEED, "--hostfile hosts --no_ssh --node_rank {rank} --master_addr "
        "127.0.0.1 --master_port {port}", [DUMP, "--a"])
    assert own == [4, 0] and mine == [4, 4]
    assert_same(theirs, ours)
    assert [ours[f"rank-{r}"]["env"]["CROSS_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
    assert ours["rank-3"]["argv"] == ["--local_rank=1", "--a"]


def test_accelerate_machines_are_one_run(tmp_path: Path) -> None:
    own, mine, theirs, ours = two_nodes(
        tmp_path, ACCELERATE, "--multi_gpu --num_processes 4 --num_machines 2 --machine_rank "
        "{rank} --main_process_ip 127.0.0.1 --main_process_port {port}", [DUMP, "--a"])
    assert own == [1, 0] and mine == [4, 4]
    assert_same(theirs, ours)
    assert [ours[f"rank-{r}"]["env"]["GROUP_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
