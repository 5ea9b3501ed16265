"""torchrun's options from ``PET_<DEST>`` (issue 24; plan/pet.py): the same rule as torchrun's
``env`` and ``check_env`` actions, for the same options, the flag winning, a bad value refused
with the flag's line naming the variable. In-process plans; the pods on loopback are
test_kubernetes.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from forgelm_tui.plan import pet
from forgelm_tui.plan.options import UsageError
from forgelm_tui.plan.planner import Plan, Planner

pytestmark = pytest.mark.timeout(30)


def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
         *args: str, target: tuple[str, ...] = ("demo", "--steps", "1")) -> Plan:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Planner(["--no-tui", "--run-dir", str(tmp_path / "run"), *args, *target],
                   "test").plan()


def refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
            *args: str) -> str:
    with pytest.raises(UsageError) as caught:
        plan(tmp_path, monkeypatch, env, *args)
    return str(caught.value)


def test_a_variable_sets_its_option_and_the_flag_wins(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert plan(tmp_path, monkeypatch, {"PET_NPROC_PER_NODE": "3"}).spec.nproc_per_node == 3
    assert plan(tmp_path, monkeypatch, {}, "--nproc-per-node", "2").spec.nproc_per_node == 2
    assert plan(tmp_path, monkeypatch, {}, "--nproc_per_node=1").spec.nproc_per_node == 1
    assert plan(tmp_path, monkeypatch, {"PET_MAX_RESTARTS": "2"}).info.max_restarts == 2


@pytest.mark.parametrize(("value", "on"), [("1", True), ("0", False), (" 1 ", True),
                                           ("-1", True)])
def test_a_flag_variable_is_an_integer_as_torchrun_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    from forgelm_tui.plan.options import build_parser, split_argv

    monkeypatch.setenv("PET_STANDALONE", value)
    parser = build_parser()
    options, _ = split_argv(["--no-tui", "x.py"], parser)
    ns = parser.parse_args(options)
    assert pet.apply(ns, options, parser, {"PET_STANDALONE": value}).flags == {
        "--standalone": "PET_STANDALONE"}
    assert ns.standalone is on


@pytest.mark.parametrize("value", ["true", "yes", "", "1.0"])
def test_a_flag_variable_that_is_no_integer_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    message = refused(tmp_path, monkeypatch, {"PET_STANDALONE": value})
    assert message.startswith("PET_STANDALONE must be an integer as torchrun reads it")


@pytest.mark.parametrize(("env", "words"), [
    ({"PET_NPROC_PER_NODE": "banana"}, "--nproc-per-node (from PET_NPROC_PER_NODE) must be"),
    ({"PET_NNODES": "two"}, "--nnodes (from PET_NNODES) must be N or MIN:MAX"),
    ({"PET_NNODES": "1:4"}, "--nnodes (from PET_NNODES) 1:4 (elastic) needs --rdzv-backend c10d"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "5", "PET_MASTER_ADDR": "h", "PET_MASTER_PORT": "29500"},
     "--node-rank (from PET_NODE_RANK) 5 is outside 0..1"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "h",
      "PET_MASTER_PORT": "port"}, "(from PET_MASTER_PORT)"),
    ({"PET_RDZV_BACKEND": "etcd", "PET_NNODES": "2"}, "--rdzv-backend (from PET_RDZV_BACKEND)"),
    ({"PET_SHUTDOWN_TIMEOUT": "30"}, "PET_SHUTDOWN_TIMEOUT: torchrun's --shutdown-timeout: use"),
    ({"PET_SIGNALS_TO_HANDLE": "SIGTERM"}, "--forward-signals"),
    ({"PET_VIRTUAL_LOCAL_RANK": "1"}, "--virtual-local-rank is not supported"),
    ({"PET_NNODES": ""}, "PET_NNODES is empty: give --nnodes a value there, or unset it"),
    ({"PET_MASTER_ADDR": " ", "PET_NNODES": "2"}, "PET_MASTER_ADDR is empty"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job master",
      "PET_MASTER_PORT": "23456"}, "--master-addr (from PET_MASTER_ADDR) 'job master' is not"),
], ids=["nproc", "nnodes", "elastic", "node-rank", "port", "backend", "shutdown", "signals",
        "virtual", "empty", "blank", "space"])
def test_a_bad_value_is_refused_with_the_flags_line_naming_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], words: str) -> None:
    assert words in refused(tmp_path, monkeypatch, env)


def test_a_bad_value_given_as_a_flag_is_not_blamed_on_a_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = refused(tmp_path, monkeypatch, {"PET_NNODES": "1:4"}, "--nproc-per-node", "x")
    assert message.startswith("--nproc-per-node must be") and "PET_" not in message


def test_no_variable_for_what_torchrun_gives_none_nor_forgelm_tuis_own_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = plan(tmp_path, monkeypatch, {"PET_LOGS_SPECS": "x", "PET_NUMA_BINDING": "node",
                                       "PET_GRACE": "1", "PET_DRAIN": "-5", "PET_TUI": "1"})
    assert got.spec.grace == 30.0 and got.spec.drain == 60.0 and got.view == "headless"


def test_every_torchrun_option_with_a_variable_is_taken_or_refused_by_name() -> None:
    """torch's own parser says which options read PET_ (its env and check_env actions):
    each is one forgelm-tui takes from its variable, or refuses by name, none silently."""
    from torch.distributed.argparse_util import check_env, env
    from torch.distributed.run import get_args_parser

    actions = [a for a in get_args_parser()._actions if isinstance(a, env | check_env)]
    values = {a.dest for a in actions if isinstance(a, env)}
    flags = {a.dest for a in actions if isinstance(a, check_env)}
    assert values == set(pet.VALUES) | (set(pet.NOT_TAKEN) - {"virtual_local_rank"})
    assert flags == set(pet.FLAGS) | {"virtual_local_rank"}
    no_variable = {a.dest for a in get_args_parser()._actions if a.option_strings} - values \
        - flags - {"help"}
    assert no_variable == {"logs_specs", "numa_binding"}  # none here either


def test_pods_variables_make_a_multi_node_plan(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Kubeflow's PyTorchJob: PET_ for torchrun, and WORLD_SIZE / RANK / MASTER_* for the
    pod, which the ranks never see (each gets its own, as under torchrun)."""
    got = plan(tmp_path, monkeypatch, {
        "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2",
        "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "1",
        "PYTHONUNBUFFERED": "1"})
    assert got.cluster is not None
    assert (got.cluster.nnodes, got.cluster.node_rank, got.cluster.master_addr,
            got.cluster.master_port, got.cluster.store_port) == (2, 1, "job-master-0", 23456,
                                                                 23457)
    assert got.spec.nproc_per_node == 2


def test_a_flag_torchrun_reads_as_off_is_no_refusal(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    got = plan(tmp_path, monkeypatch, {"PET_VIRTUAL_LOCAL_RANK": "0", "PET_STANDALONE": "0"})
    assert got.cluster is None


def test_a_module_from_pet_module_is_refused_naming_it(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError) as caught:
        plan(tmp_path, monkeypatch, {"PET_MODULE": "1"}, target=("no_such_module_xyz",))
    assert str(caught.value).startswith("-m (from PET_MODULE) no_such_module_xyz: no module")
