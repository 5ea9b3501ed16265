"""The multi-node command line and SLURM's srun step, checked before anything starts."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import pytest

from forgelm_tui.cluster.config import cluster_config
from forgelm_tui.cluster.join import ClusterConfig
from forgelm_tui.cluster.slurm import default_port
from forgelm_tui.plan.options import UsageError, build_parser

pytestmark = pytest.mark.timeout(30)

FLAGS = ["--master-addr", "10.0.0.1", "--master-port", "29500"]
STEP = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_JOB_ID": "1234"}
ONE_NODE_STEP = {**STEP, "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "1",
                 "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
                 "SLURM_STEP_NODELIST": "gpu01"}


def ns(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(list(args))


def config(*args: str, env: Mapping[str, str] | None = None,
           nproc: int = 4) -> ClusterConfig | None:
    return cluster_config(ns(*args), nproc, "own-run-id", env or {})


def multi(*args: str, env: Mapping[str, str] | None = None) -> ClusterConfig:
    cfg = config(*args, env=env)
    assert cfg is not None
    return cfg


def refused(*args: str, env: Mapping[str, str] | None = None) -> str:
    with pytest.raises(UsageError) as info:
        config(*args, env=env)
    return str(info.value)


# ---------------------------------------------------------------------- the command line


@pytest.mark.parametrize("args", [(), ("--nnodes", "1"), ("--nnodes", "1:1"),
                                  ("--nnodes", "1", "--node-rank", "0")])
def test_one_node_is_no_cluster(args: tuple[str, ...]) -> None:
    assert config(*args) is None


def test_static_two_nodes() -> None:
    cfg = multi("--nnodes", "2:2", "--node-rank", "1", *FLAGS)
    assert (cfg.nnodes, cfg.node_rank, cfg.backend, cfg.source) == (2, 1, "static", "flags")
    assert (cfg.master_addr, cfg.master_port) == ("10.0.0.1", 29500)
    assert (cfg.store_host, cfg.store_port) == ("10.0.0.1", 29501)  # master port + 1
    assert (cfg.run_id, cfg.run_id_fixed, cfg.nproc) == ("own-run-id", False, 4)
    assert (cfg.join_timeout, cfg.node_timeout) == (300.0, 10.0)


def test_timeouts_from_flags() -> None:
    cfg = multi("--nnodes", "2", "--node-rank", "0", *FLAGS, "--join-timeout", "7",
                "--node-timeout", "2.5")
    assert (cfg.join_timeout, cfg.node_timeout) == (7.0, 2.5)
    assert "--join-timeout" in refused("--nnodes", "2", "--node-rank", "0", *FLAGS,
                                       "--join-timeout", "0")


@pytest.mark.parametrize(("nnodes", "words"), [
    ("1:4", "(elastic) needs --rdzv-backend c10d and --rdzv-endpoint"),
    ("2:3", "(elastic) needs --rdzv-backend c10d"), ("3:2", "MAX is below MIN"),
    ("0", "at least 1"), ("two", "N or MIN:MAX")])
def test_bad_nnodes_refused(nnodes: str, words: str) -> None:
    assert words in refused("--nnodes", nnodes, "--node-rank", "0", *FLAGS)


def test_static_needs_a_node_rank() -> None:
    assert "--node-rank is required" in refused("--nnodes", "2", *FLAGS)


@pytest.mark.parametrize(("rank", "words"), [("2", "outside 0..1"), ("-1", "outside 0..1"),
                                             ("x", "whole number")])
def test_bad_node_rank_refused(rank: str, words: str) -> None:
    assert words in refused("--nnodes", "2", "--node-rank", rank, *FLAGS)


def test_c10d_numbers_nodes_as_they_join() -> None:
    cfg = multi("--nnodes", "3", "--rdzv-backend", "c10d", *FLAGS)
    assert (cfg.node_rank, cfg.backend, cfg.nnodes) == (None, "c10d", 3)
    assert "static or c10d" in refused("--nnodes", "2", "--node-rank", "0",
                                       "--rdzv-backend", "etcd", *FLAGS)


def test_rdzv_endpoint_is_the_control_store() -> None:
    cfg = multi("--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "head:29400")
    assert (cfg.store_host, cfg.store_port) == ("head", 29400)
    assert (cfg.master_addr, cfg.master_port) == ("head", None)  # node 0 picks one
    cfg = multi("--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "head:29400",
                "--master-port", "31000", "--master-addr", "10.1.1.1")
    assert (cfg.store_port, cfg.master_addr, cfg.master_port) == (29400, "10.1.1.1", 31000)
    cfg = multi("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "[::1]:29400")
    assert (cfg.store_host, cfg.store_port) == ("::1", 29400)


@pytest.mark.parametrize("endpoint", ["head", ":29400", "head:port", "head:0", "head:70000"])
def test_bad_rdzv_endpoint_refused(endpoint: str) -> None:
    assert "--rdzv-endpoint" in refused("--nnodes", "2", "--node-rank", "0",
                                        "--rdzv-endpoint", endpoint)


def test_static_without_an_address_refused() -> None:
    assert "--master-addr and --master-port" in refused("--nnodes", "2", "--node-rank", "0",
                                                        "--master-port", "29500")
    assert "--master-addr and --master-port" in refused("--nnodes", "2", "--node-rank", "0",
                                                        "--master-addr", "h")


def test_rdzv_id_fixes_the_run_id() -> None:
    cfg = multi("--nnodes", "2", "--node-rank", "1", *FLAGS, "--rdzv-id", "job-42")
    assert (cfg.run_id, cfg.run_id_fixed) == ("job-42", True)


# ---------------------------------------------------------------------- SLURM


def fake_scontrol(directory: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    script = directory / "scontrol"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}:/usr/bin:/bin")


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``scontrol`` that expands gpu[01-02] and gpu01 (nothing else), first on PATH."""
    fake_scontrol(tmp_path, monkeypatch, 'case "$*" in\n'
                  '  "show hostnames gpu[01-02]") printf "gpu01\\ngpu02\\n" ;;\n'
                  '  "show hostnames gpu01") echo gpu01 ;;\n'
                  '  *) echo "scontrol: error: unexpected $*" >&2; exit 1 ;;\n'
                  'esac')
    return tmp_path


def test_srun_step_configures_the_node(scontrol: Path) -> None:
    cfg = multi(env=STEP)
    assert (cfg.nnodes, cfg.node_rank, cfg.source) == (2, 1, "slurm")
    assert (cfg.master_addr, cfg.store_host) == ("gpu01", "gpu01")
    assert (cfg.run_id, cfg.run_id_fixed) == ("slurm-1234.0", True)
    assert cfg.master_port == 20000 + 2 * (1234 * 4 % 10000) == default_port("1234", "0")
    assert cfg.store_port == cfg.master_port + 1
    assert cfg.nproc == 4


def test_srun_step_with_a_port_and_a_run_id(scontrol: Path) -> None:
    cfg = multi("--master-port", "31000", "--rdzv-id", "mine", env=STEP)
    assert (cfg.source, cfg.master_port, cfg.store_port) == ("slurm", 31000, 31001)
    assert cfg.run_id == "mine"


def test_default_port_stays_in_range() -> None:
    assert default_port("2499", "3") == 39998 and default_port("2500") == 20000
    assert default_port("not-a-number") == 29500


def test_neighbouring_jobs_and_steps_never_share_a_port() -> None:
    """A job's master port and its control store's (+1) against its neighbours' on one node:
    job N's store port was job N+1's master port (found on the real SLURM cluster)."""
    taken: set[int] = set()
    for job in range(1000, 1100):
        for step in ("0", "1", "2"):
            port = default_port(str(job), step)
            assert port >= 20000 and port + 1 <= 39999
            assert not {port, port + 1} & taken, (job, step)
            taken |= {port, port + 1}


@pytest.mark.parametrize("tasks", [{"SLURM_STEP_NUM_TASKS": "4",
                                    "SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
                                   {"SLURM_STEP_NUM_TASKS": "2",
                                    "SLURM_STEP_TASKS_PER_NODE": "2,0"}])
def test_more_than_one_task_per_node_refused(scontrol: Path, tasks: dict[str, str]) -> None:
    message = refused(env={**STEP, **tasks})
    assert "one forgelm-tui per node" in message and "--ntasks-per-node=1" in message
    assert "\n" not in message


def test_scontrol_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    message = refused(env=STEP)
    assert "scontrol" in message and "--master-addr" in message


def test_scontrol_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(tmp_path, monkeypatch, 'echo "slurm_load_node: Invalid node name" >&2\n'
                  "exit 1")
    message = refused(env=STEP)
    assert "scontrol show hostnames gpu[01-02]" in message
    assert "Invalid node name" in message


def test_scontrol_printing_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(tmp_path, monkeypatch, "exit 0")
    assert "no hosts" in refused(env=STEP)


def test_flags_win_over_slurm(scontrol: Path) -> None:
    cfg = multi("--nnodes", "2", "--node-rank", "0", *FLAGS, env=STEP)
    assert (cfg.source, cfg.node_rank, cfg.master_addr) == ("flags", 0, "10.0.0.1")
    assert config("--rdzv-endpoint", "h:1234", env=STEP) is None  # one node, as flags say
    assert "--node-rank is required" in refused("--nnodes", "2", *FLAGS, env=STEP)


def test_one_node_step_is_no_cluster(scontrol: Path) -> None:
    assert config(env=ONE_NODE_STEP) is None


def test_one_node_step_needs_no_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol, as inside a container
    assert config(env=ONE_NODE_STEP) is None


def test_outside_an_srun_step_slurm_is_ignored(scontrol: Path) -> None:
    batch = {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}
    assert config(env=batch) is None


@pytest.mark.parametrize(("change", "words"), [
    ({"SLURM_STEP_NUM_NODES": "two"}, "SLURM_STEP_NUM_NODES='two' is not a number"),
    ({"SLURM_STEP_NODELIST": ""}, "without a node list"),
])
def test_broken_step_refused(scontrol: Path, change: dict[str, str], words: str) -> None:
    assert words in refused(env={**STEP, **change})


# ---------------------------------------------------------------- --rdzv-conf (issue 25)

def test_rdzv_conf_keys_torch_reads_are_honoured() -> None:
    cfg = multi("--nnodes", "2", "--node-rank", "1", *FLAGS, "--rdzv-conf",
                " join_timeout=120 , last_call_timeout=2,close_timeout=7,read_timeout=45,"
                "keep_alive_interval=2,keep_alive_max_attempt=4,store_type=TCP,is_host=no")
    assert (cfg.join_timeout, cfg.last_call, cfg.ack_wait, cfg.call_wait, cfg.node_timeout,
            cfg.is_host) == (120.0, 2.0, 7.0, 45.0, 8.0, False)
    cfg = multi("--nnodes", "2", "--node-rank", "0", *FLAGS, "--rdzv-conf",
                "keep_alive_interval=4")  # torch's keep_alive_max_attempt default: 3
    assert (cfg.node_timeout, cfg.join_timeout, cfg.last_call) == (12.0, 300.0, 30.0)


def test_forgelm_tuis_own_flags_win_over_rdzv_conf() -> None:
    cfg = multi("--nnodes", "2", "--node-rank", "0", *FLAGS, "--join-timeout", "9",
                "--node-timeout", "3", "--rdzv-conf", "join_timeout=120,keep_alive_interval=9")
    assert (cfg.join_timeout, cfg.node_timeout) == (9.0, 3.0)


@pytest.mark.parametrize(("conf", "expected"), [
    ("heartbeat_timeout=5", "--rdzv-conf heartbeat_timeout: not supported (forgelm-tui's "
                            "heartbeats are its own"),
    ("timeout=900", "--rdzv-conf timeout: not supported (the etcd rendezvous' setting"),
    ("use_agent_store=1", "--rdzv-conf use_agent_store: not supported (not a key of torch's "
                          "c10d rendezvous)"),
    ("store_type=file", "--rdzv-conf store_type=file: forgelm-tui's control store is a TCPStore"),
    ("join_timeout=soon", "--rdzv-conf join_timeout=soon: a whole number of seconds"),
    ("last_call_timeout=0", "--rdzv-conf last_call_timeout=0: must be more than 0"),
    ("is_host=maybe", "--rdzv-conf is_host=maybe: use 1/true/yes or 0/false/no"),
    ("join_timeout", "--rdzv-conf must be KEY=VALUE,...; got 'join_timeout'"),
    ("is_host=1", "--rdzv-conf is_host=1: node 1 does not host the control store"),
])
def test_rdzv_conf_keys_are_refused_by_name(conf: str, expected: str) -> None:
    assert expected in refused("--nnodes", "2", "--node-rank", "1", *FLAGS, "--rdzv-conf", conf)


def test_rdzv_conf_is_checked_on_one_node_too() -> None:
    assert "--rdzv-conf timeout" in refused("--rdzv-conf", "timeout=1")
    assert config("--rdzv-conf", "join_timeout=5") is None


def test_an_elastic_range_with_c10d_and_an_endpoint_is_a_run_of_min_to_max_nodes() -> None:
    cfg = multi("--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400")
    assert (cfg.min_nodes, cfg.nnodes, cfg.elastic, cfg.node_rank) == (2, 4, True, None)
    fixed = multi("--nnodes", "3:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400")
    assert (fixed.nnodes, fixed.elastic) == (3, False)
