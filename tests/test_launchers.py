"""``forgelm-tui deepspeed ...`` and ``forgelm-tui accelerate launch ...`` as planned (issue 26;
plan/deepspeed_launch.py, plan/accelerate_launch.py): the launchers' own parsers and functions
decide the ranks, their devices, their environment and arguments; what forgelm-tui cannot stand
in for is refused in one line. In-process: the real launchers' runs are
tests/test_launchers_real.py."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from forgelm_tui.engine.spec import rank_argv, rank_env
from forgelm_tui.plan.options import UsageError
from forgelm_tui.plan.planner import Plan, Planner

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory with a script, no accelerate config of the user's, no visible devices."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("training: {}\n")


def plan(tmp_path: Path, *args: str) -> Plan:
    return Planner(["--no-tui", "--run-dir", str(tmp_path / "run"), *args], "test").plan()


def refusal(tmp_path: Path, *args: str) -> str:
    with pytest.raises(UsageError) as caught:
        plan(tmp_path, *args)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ------------------------------------------------------------------------------ deepspeed

def test_deepspeed_ranks_get_its_environment_and_local_rank_after_the_script(
        tmp_path: Path) -> None:
    got = plan(tmp_path, "deepspeed", "--num_gpus", "2", "--master_port", "29517", "train.py",
               "--foo", "1")
    spec = got.spec
    assert (spec.nproc_per_node, spec.nnodes, spec.master_port) == (2, 1, 29517)
    assert spec.env_style == "deepspeed" and spec.extra_env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert rank_argv(spec, 1)[-4:] == ("train.py", "--local_rank=1", "--foo", "1")
    env = rank_env(spec, 1, {"PATH": "/bin"})
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CROSS_RANK", "CROSS_SIZE",
                                "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "CROSS_RANK": "0", "CROSS_SIZE": "1",
        "LOCAL_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}
    absent = {"LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
              "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
    assert not absent & set(env) and not [k for k in env if k.startswith("TORCHELASTIC_")]


@pytest.mark.parametrize(("args", "nproc", "devices"), [
    (["--include", "localhost:1,3"], 2, "1,3"),
    (["--num_gpus", "3", "--exclude", "localhost:1"], None, None),
    (["--num_accelerators", "1"], 1, "0"),
], ids=["include", "num-and-exclude", "num-accelerators"])
def test_deepspeed_devices_as_its_runner_chooses_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], nproc: int | None,
        devices: str | None) -> None:
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "device_count", lambda self: 4)
    if nproc is None:
        assert "cannot specify --num_nodes/--num_gpus with --include/--exclude" in refusal(
            tmp_path, "deepspeed", *args, "train.py")
        return
    spec = plan(tmp_path, "deepspeed", *args, "train.py").spec
    assert spec.nproc_per_node == nproc and spec.extra_env["CUDA_VISIBLE_DEVICES"] == devices


@pytest.mark.parametrize(("args", "devices"), [
    ([], "2,3"), (["--include", "localhost:3"], "3"), (["--exclude", "localhost:0"], "1,2,3"),
], ids=["alone", "include", "exclude"])
def test_deepspeed_visible_devices_are_taken_as_its_runner_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], devices: str) -> None:
    """4 GPUs, CUDA_VISIBLE_DEVICES=2,3 (a scheduler's share of the node): deepspeed's runner
    counts the devices without the variable (it deletes it), then runs on the ones it named,
    unless a filter was given. The count follows the variable, as CUDA's does."""
    import os

    from deepspeed.accelerator import get_accelerator

    def count(self: object) -> int:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return 4 if visible is None else len(visible.split(","))

    monkeypatch.setattr(type(get_accelerator()), "device_count", count)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    spec = plan(tmp_path, "deepspeed", *args, "train.py").spec
    assert spec.extra_env["CUDA_VISIBLE_DEVICES"] == devices
    assert spec.nproc_per_node == len(devices.split(","))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"  # forgelm-tui's own, as it was


@pytest.mark.parametrize(("args", "tail"), [
    (["--module", "json.tool", "--indent", "2"], ("json.tool", "--local_rank=0", "--indent", "2")),
    (["--no_python", "true", "x"], ("true", "--local_rank=0", "x")),
    (["--no_local_rank", "train.py", "--foo"], ("train.py", "--foo")),
], ids=["module", "no-python", "no-local-rank"])
def test_deepspeed_program_forms(tmp_path: Path, args: list[str], tail: tuple[str, ...]) -> None:
    spec = plan(tmp_path, "deepspeed", "--num_gpus", "1", *args).spec
    assert rank_argv(spec, 0)[-len(tail):] == tail


def test_deepspeed_local_rank_is_withheld_from_forgelm_with_a_line(tmp_path: Path) -> None:
    got = plan(tmp_path, "deepspeed", "--num_gpus", "2", "--module", "forgelm.cli", "--config",
               "job.yaml")
    assert got.info.mode == "forgelm" and got.spec.local_rank_at is None
    assert not any(a.startswith("--local_rank") for a in rank_argv(got.spec, 1))
    assert any("--local_rank=N is not passed to ForgeLM" in w for w in got.warnings)


def test_deepspeed_hostfile_of_one_host_gives_its_slots(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("# one node\nworker-0 slots=3\n")
    spec = plan(tmp_path, "deepspeed", "--hostfile", "hosts", "train.py").spec
    assert spec.nproc_per_node == 3 and spec.nnodes == 1


def test_deepspeed_no_ssh_is_a_node_of_a_multi_node_run(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("worker-0 slots=2\nworker-1 slots=2\n")
    got = plan(tmp_path, "deepspeed", "--hostfile", "hosts", "--no_ssh", "--node_rank", "1",
               "--master_addr", "10.0.0.1", "--master_port", "29600", "train.py")
    assert got.cluster is not None
    assert (got.cluster.nnodes, got.cluster.node_rank) == (2, 1)
    assert got.spec.env_style == "deepspeed" and got.spec.nproc_per_node == 2


@pytest.mark.parametrize(("args", "words"), [
    (["--hostfile", "hosts", "train.py"],
     "forgelm-tui deepspeed with 2 hosts in hosts: DeepSpeed's pdsh runner would start them; "
     "forgelm-tui runs the ranks of one node: start it on every node, e.g. srun"),
    (["--hostfile", "hosts", "--no_ssh", "--node_rank", "1", "train.py"],
     "deepspeed --no_ssh: give --master_addr"),
    (["--hostfile", "hosts", "--no_ssh", "--node_rank", "5", "--master_addr", "h", "train.py"],
     "--node_rank must be 0..1 (got 5)"),
    (["--autotuning", "tune", "train.py"], "forgelm-tui deepspeed --autotuning: the autotuner"),
    (["--bind_cores_to_rank", "train.py"], "numactl core binding is not supported"),
    (["--force_multi", "train.py"], "forgelm-tui deepspeed --force_multi"),
    (["--save_pid", "train.py"], "forgelm-tui deepspeed --save_pid"),
    (["-m", "forgelm.cli", "--config", "job.yaml"], "deepspeed: unrecognized arguments: -m"),
    (["--num_gpus", "two", "train.py"], "deepspeed: argument --num_gpus"),
    (["--module", "--no_python", "x"], "--module and --no_python cannot be used together"),
    (["--num_nodes", "2", "train.py"], "--num_nodes 2 but no other nodes are given"),
    ([], "deepspeed: the following arguments are required: user_script"),
    (["--no_ssh", "train.py"], "deepspeed --no_ssh: --node_rank must be 0..0 (got -1)"),
    (["--hostfile", "/proc/self/mem", "train.py"], "deepspeed: "),
], ids=["pdsh", "no-master", "node-rank", "autotuning", "bind", "force-multi", "save-pid",
        "dash-m", "bad-number", "module-no-python", "num-nodes", "no-script", "no-ssh-alone",
        "unreadable-hostfile"])
def test_deepspeed_refusals_are_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    (tmp_path / "hosts").write_text("worker-0 slots=2\nworker-1 slots=2\n")
    assert words in refusal(tmp_path, "deepspeed", *args)


def test_deepspeed_not_installed_is_one_line(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "deepspeed.launcher", None)
    message = refusal(tmp_path, "deepspeed", "train.py")
    assert message.startswith("deepspeed is not installed for ") and "pip install" in message


# ------------------------------------------------------------------------------ accelerate

ACCELERATE = ["accelerate", "launch", "--main_process_port", "29531"]


def test_accelerate_multi_gpu_flags_become_torchrun_ranks_and_its_variables(
        tmp_path: Path) -> None:
    spec = plan(tmp_path, *ACCELERATE, "--multi_gpu", "--num_processes", "2",
                "--mixed_precision", "bf16", "train.py", "--lr", "1").spec
    assert (spec.nproc_per_node, spec.master_port, spec.env_style) == (2, 29531, "torchrun")
    assert spec.argv[-3:] == ("train.py", "--lr", "1") and spec.local_rank_at is None
    assert spec.extra_env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert spec.extra_env["ACCELERATE_DYNAMO_BACKEND"] == "NO"
    assert spec.extra_env["OMP_NUM_THREADS"] == "1"
    assert rank_env(spec, 1, {})["ACCELERATE_MIXED_PRECISION"] == "bf16"


@pytest.mark.parametrize(("config", "expected"), [
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
     "  fsdp_offload_params: true\n  fsdp_version: 1\n",
     {"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": "FULL_SHARD",
      "FSDP_OFFLOAD_PARAMS": "true"}),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"
     "  gradient_accumulation_steps: 4\n",
     {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
      "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}),
], ids=["fsdp", "deepspeed"])
def test_accelerate_config_file_settings_reach_every_rank(tmp_path: Path, config: str,
                                                          expected: dict[str, str]) -> None:
    (tmp_path / "acc.yaml").write_text("compute_environment: LOCAL_MACHINE\n" + config +
                                       "mixed_precision: 'no'\nnum_machines: 1\n"
                                       "num_processes: 2\nmachine_rank: 0\n")
    spec = plan(tmp_path, *ACCELERATE, "--config_file", "acc.yaml", "train.py").spec
    assert spec.nproc_per_node == 2 and spec.env_style == "torchrun"
    assert {k: spec.extra_env.get(k) for k in expected} == expected


def test_accelerate_machines_map_onto_forgelm_tuis_nodes(tmp_path: Path) -> None:
    got = plan(tmp_path, *ACCELERATE, "--multi_gpu", "--num_processes", "4", "--num_machines",
               "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1", "train.py")
    assert got.cluster is not None and (got.cluster.nnodes, got.cluster.node_rank) == (2, 1)
    assert got.spec.nproc_per_node == 2


def test_accelerate_one_process_launcher_gives_no_rank_variables(tmp_path: Path) -> None:
    spec = plan(tmp_path, "accelerate", "launch", "--cpu", "-m", "json.tool").spec
    assert spec.nproc_per_node == 1 and spec.env_style == "single"
    assert spec.extra_env["ACCELERATE_USE_CPU"] == "True"
    env = rank_env(spec, 0, {})
    assert "RANK" not in env and "WORLD_SIZE" not in env and "MASTER_PORT" not in env


def test_accelerate_forgelms_documented_line_plans_as_forgelm_mode(tmp_path: Path) -> None:
    got = plan(tmp_path, "accelerate", "launch", "--num_processes=4", "-m", "forgelm.cli",
               "--config", "job.yaml")
    assert got.info.mode == "forgelm"  # one process on a machine without GPUs, as accelerate


@pytest.mark.parametrize(("args", "words"), [
    (["--multi_gpu", "--num_processes", "1", "train.py"],
     "accelerate launch: You need to use at least 2 processes to use `--multi_gpu`."),
    (["--no-such-flag", "train.py"], "accelerate launch: unrecognized arguments: --no-such-flag"),
    (["--multi_gpu", "--cpu", "train.py"], "You can only use one of"),
    (["--tpu", "train.py"], "accelerate's TPU launcher is not supported"),
    (["--mpirun_hostfile", "h", "--cpu", "train.py"], "--mpirun_hostfile: mpirun starts"),
    (["--use_deepspeed", "--num_machines", "2", "--num_processes", "4", "--machine_rank", "0",
      "--main_process_ip", "h", "train.py"], "DeepSpeed's pdsh multi-node launcher"),
    (["--multi_gpu", "--num_processes", "2", "--mixed_precision", "fp9", "train.py"],
     "accelerate launch: argument --mixed_precision"),
], ids=["one-process-multi-gpu", "unknown-flag", "two-types", "tpu", "mpirun", "ds-pdsh",
        "precision"])
def test_accelerate_refusals_are_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    assert words in refusal(tmp_path, *ACCELERATE, *args)


@pytest.mark.parametrize("version", ["1.9.0", "2.0.0", None], ids=["old", "new", "missing"])
def test_an_accelerate_not_tested_or_missing_names_the_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    real = metadata.version

    def fake(name: str) -> str:
        if name != "accelerate":
            return real(name)
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(metadata, "version", fake)
    message = refusal(tmp_path, "accelerate", "launch", "train.py")
    assert "pip install 'forgelm-tui[accelerate]'" in message
    assert (f"accelerate {version} is not a version forgelm-tui was tested with" in message
            if version else message.startswith("accelerate is not installed for "))


@pytest.mark.parametrize(("words", "launcher"), [
    (["accelerate", "launch"], "accelerate"), (["accelerate-launch"], "accelerate"),
    (["python3", "-m", "accelerate.commands.launch"], "accelerate"),
    (["deepspeed"], "deepspeed"), (["deepspeed.pt"], "deepspeed"), (["ds"], "deepspeed"),
    (["python", "-m", "deepspeed.launcher.runner"], "deepspeed"),
])
def test_every_spelling_of_a_launcher_is_its_own(tmp_path: Path, words: list[str],
                                                launcher: str) -> None:
    """The launchers' console scripts (deepspeed installs deepspeed, deepspeed.pt and ds;
    accelerate, accelerate launch and accelerate-launch) and their modules."""
    from forgelm_tui.plan.prefix import launcher_of

    assert launcher_of([*words, "train.py"]) == (launcher, len(words))
    args = ["--num_processes", "1"] if launcher == "accelerate" else ["--num_gpus", "1"]
    got = plan(tmp_path, *words, *args, "train.py")
    assert got.info.launcher == ("accelerate launch" if launcher == "accelerate" else launcher)
    assert got.spec.argv[-1] == "train.py" or got.spec.local_rank_at is not None


@pytest.mark.parametrize("before", [["--nproc-per-node", "3"], ["--nnodes", "2"],
                                    ["--master-addr=10.0.0.9"]], ids=["nproc", "nnodes", "addr"])
@pytest.mark.parametrize("launcher", [["deepspeed"], ["accelerate", "launch"]])
def test_torchrun_options_before_another_launcher_are_refused(
        tmp_path: Path, before: list[str], launcher: list[str]) -> None:
    """They would be lost: the launcher's own flags give the ranks and the rendezvous."""
    spelled = " ".join(launcher)
    assert f"{before[0].split('=')[0]} before {spelled!r}: {spelled}'s own flags give the " \
        "ranks" in refusal(tmp_path, *before, *launcher, "train.py")


def test_pet_variables_are_not_deepspeeds(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_MAX_RESTARTS", "3")
    got = plan(tmp_path, "deepspeed", "--num_gpus", "1", "train.py")
    assert got.cluster is None and got.info.max_restarts == 0


def test_torchruns_role_names_the_ranks_role(tmp_path: Path) -> None:
    for args in (["--role", "trainer", "train.py"], ["torchrun", "--role=trainer", "train.py"]):
        assert rank_env(plan(tmp_path, *args).spec, 0, {})["ROLE_NAME"] == "trainer"
    assert rank_env(plan(tmp_path, "train.py").spec, 0, {})["ROLE_NAME"] == "default"


def test_accelerate_with_its_port_taken_runs_standalone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate's own fallback on one machine: torchrun's --standalone (a free port)."""
    import accelerate.utils.launch as accelerate_utils

    monkeypatch.setattr(accelerate_utils, "is_port_in_use", lambda port: True)
    spec = plan(tmp_path, "accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                "train.py").spec
    assert spec.nproc_per_node == 2 and spec.master_port != 29500


@pytest.mark.parametrize(("config", "words"), [
    ("a: [\n", "accelerate launch: "),
    ("- one\n- two\n", "accelerate launch: AttributeError: "),
    ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\ngpu_ids: 0\n"
     "num_processes: 2\n", "accelerate launch: AttributeError: "),
], ids=["bad-yaml", "a-list", "gpu-ids-number"])
def test_accelerate_bad_config_files_are_one_line(tmp_path: Path, config: str,
                                                  words: str) -> None:
    (tmp_path / "acc.yaml").write_text(config)
    assert words in refusal(tmp_path, "accelerate", "launch", "--config_file", "acc.yaml",
                            "train.py")


def test_accelerate_machines_without_the_main_ip_are_refused(tmp_path: Path) -> None:
    assert "--num_machines 2: give --main_process_ip" in refusal(
        tmp_path, *ACCELERATE, "--multi_gpu", "--num_processes", "4", "--num_machines", "2",
        "--machine_rank", "1", "train.py")


def test_accelerate_deepspeed_nossh_is_deepspeeds_no_ssh_node(tmp_path: Path) -> None:
    """deepspeed_multinode_launcher nossh: accelerate runs DeepSpeed's --no_ssh form on each
    machine, with its environment: a node of a forgelm-tui run, deepspeed's rank environment,
    accelerate's variables."""
    (tmp_path / "hosts").write_text("m0 slots=2\nm1 slots=2\n")
    got = plan(tmp_path, *ACCELERATE, "--use_deepspeed", "--num_processes", "4",
               "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
               "--deepspeed_multinode_launcher", "nossh", "--deepspeed_hostfile", "hosts",
               "train.py")
    assert got.cluster is not None and (got.cluster.nnodes, got.cluster.node_rank) == (2, 1)
    assert got.spec.env_style == "deepspeed" and got.info.launcher == "accelerate launch"
    assert got.spec.extra_env["ACCELERATE_USE_DEEPSPEED"] == "true"


def test_pet_role_names_the_role_and_the_flag_wins(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_ROLE", "worker")
    assert rank_env(plan(tmp_path, "train.py").spec, 0, {})["ROLE_NAME"] == "worker"
    assert rank_env(plan(tmp_path, "--role", "x", "train.py").spec, 0, {})["ROLE_NAME"] == "x"


@pytest.mark.parametrize("launcher", [["deepspeed", "--num_gpus", "2"],
                                      ["accelerate", "launch", "--multi_gpu", "--num_processes",
                                       "2"], ["accelerate", "launch", "--cpu"]],
                         ids=["deepspeed", "accelerate", "accelerate-one-process"])
def test_a_one_machine_launcher_in_a_multi_node_srun_step_stays_one_machine_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: list[str]) -> None:
    """Under srun on 2 nodes, ``accelerate launch --multi_gpu ...`` (or deepspeed without a
    hostfile) runs a job of its own on each node; forgelm-tui alone would make the step one
    run. The launcher's meaning wins, and one line says how to make one job."""
    for name, value in {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
                        "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
                        "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]"}.items():
        monkeypatch.setenv(name, value)
    got = plan(tmp_path, "--grace", "5", *launcher, "train.py")
    assert got.cluster is None
    assert any("on one machine in a 2-node SLURM step: each node runs a job of its own" in w
               for w in got.warnings), got.warnings
