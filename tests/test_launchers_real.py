"""The real ``accelerate launch`` and ``deepspeed`` beside forgelm-tui in front of the same
command (issue 26): each rank's environment and arguments are the launcher's own, key by key,
but for the differences listed here; the true code comes back where the launchers lose it; a
failing rank stops the others at once. CPU: ``ACCELERATE_USE_CPU=true`` makes accelerate's
ranks MULTI_CPU on gloo; deepspeed's CPU accelerator has one "device" and takes --num_gpus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import free_port_pair
from conftest import cli_env, dies_with_the_test, pid_alive, rank_script, wait_for

pytestmark = pytest.mark.timeout(180)
BIN = Path(sys.executable).parent
DUMP = rank_script("dump_env.py")
# What may differ, and why: the port (each run picks its own here, so that both run at once),
# torchrun's agent's own files and store, which forgelm-tui is instead of (its ranks make their
# own store at MASTER_PORT), and forgelm-tui's own variables; DUMP_DIR is this test's.
# (NCCL's flight-recorder pipe and dump under the run dir: forgelm-tui's, engine/nccl_dump.py)
ALLOWED = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
           "TORCHELASTIC_USE_AGENT_STORE", "DUMP_DIR", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}


def launch(cmd: list[str], tmp_path: Path, name: str, env: dict[str, str],
           cwd: Path | None = None) -> tuple[subprocess.Popen[str], Path]:
    dump = tmp_path / name
    dump.mkdir()
    proc = subprocess.Popen(cmd, cwd=cwd or tmp_path, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=cli_env({**env, "DUMP_DIR": str(dump)}), start_new_session=True,
                            preexec_fn=dies_with_the_test)
    return proc, dump


def forgelm_tui(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir",
            str(tmp_path / "run"), *args]


def side_by_side(tmp_path: Path, launcher: list[str], args: list[str], port_flag: str,
                 env: dict[str, str] | None = None) -> tuple[list[int], dict[str, Any],
                                                              dict[str, Any]]:
    """The launcher's command run by itself and behind forgelm-tui, at once (ports apart):
    both exit codes and each run's dumps by rank."""
    env = {"HF_HOME": str(tmp_path / "hf"), "ACCELERATE_USE_CPU": "true", **(env or {})}
    own, mine = free_port_pair(), free_port_pair()
    runs = [launch([*launcher, port_flag, str(own), *args], tmp_path, "own", env),
            launch(forgelm_tui(tmp_path, *WORDS[launcher[0]], port_flag, str(mine), *args),
                   tmp_path, "mine", env)]
    codes = []
    for proc, _ in runs:
        out, _ = proc.communicate(timeout=150)
        codes.append(proc.returncode)
        assert "Traceback" not in out or proc is runs[0][0], out[-3000:]
    dumps = [{p.stem: json.loads(p.read_text()) for p in dump.glob("rank-*.json")}
             for _, dump in runs]
    return codes, dumps[0], dumps[1]


def assert_same(own: dict[str, Any], mine: dict[str, Any]) -> None:
    assert sorted(own) == sorted(mine) and own
    for rank, theirs in own.items():
        ours = mine[rank]
        assert ours["argv"] == theirs["argv"], rank
        keys = {*theirs["env"], *ours["env"]} - ALLOWED
        differ = {k: (theirs["env"].get(k), ours["env"].get(k)) for k in sorted(keys)
                  if not k.startswith("FORGELM_TUI_")
                  and theirs["env"].get(k) != ours["env"].get(k)}
        assert not differ, (rank, differ)


ACCELERATE = [str(BIN / "accelerate"), "launch"]
DEEPSPEED = [str(BIN / "deepspeed")]
WORDS = {ACCELERATE[0]: ["accelerate", "launch"], DEEPSPEED[0]: ["deepspeed"]}  # the prefix
CONFIGS = {
    "multi-gpu": "distributed_type: MULTI_GPU\nmixed_precision: fp16\n",
    "fsdp": "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config:\n"
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
            "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
            "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
            "  fsdp_cpu_ram_efficient_loading: true\n  fsdp_sync_module_states: true\n"
            "  fsdp_offload_params: false\n  fsdp_version: 1\n",
    "deepspeed": "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n"
                 "  zero_stage: 2\n  gradient_accumulation_steps: 4\n  gradient_clipping: 1.0\n"
                 "  offload_optimizer_device: cpu\n  offload_param_device: none\n"
                 "  zero3_init_flag: false\n",
}


def test_accelerate_flags_bf16_the_true_code_and_accelerates_environment(
        tmp_path: Path) -> None:
    """The issue's line: rank 0 exits 4 (awaiting approval): accelerate returns 1, forgelm-tui
    4; every rank's ACCELERATE_* and the rest of its environment as accelerate's."""
    codes, own, mine = side_by_side(
        tmp_path, ACCELERATE, ["--multi_gpu", "--num_processes", "2", "--mixed_precision",
                               "bf16", DUMP, "--foo", "1"],
        "--main_process_port", {"DUMP_EXIT": "0=4"})
    assert codes == [1, 4]
    assert_same(own, mine)
    assert mine["rank-1"]["env"]["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert mine["rank-1"]["argv"] == ["--foo", "1"]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_accelerate_config_files_give_the_same_environment(tmp_path: Path, config: str) -> None:
    (tmp_path / "acc.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\n" + CONFIGS[config] +
        "num_machines: 1\nnum_processes: 2\nmachine_rank: 0\nrdzv_backend: static\n"
        "same_network: true\nuse_cpu: false\n")
    codes, own, mine = side_by_side(tmp_path, ACCELERATE, ["--config_file", "acc.yaml", DUMP],
                                    "--main_process_port")
    assert codes == [0, 0]
    assert_same(own, mine)
    env = mine["rank-0"]["env"]
    flag = {"multi-gpu": "ACCELERATE_MIXED_PRECISION", "fsdp": "FSDP_SHARDING_STRATEGY",
            "deepspeed": "ACCELERATE_DEEPSPEED_ZERO_STAGE"}[config]
    assert env[flag] in ("fp16", "FULL_SHARD", "2")


@pytest.mark.parametrize("args", [["--cpu", DUMP, "--x"], ["-m", "dump_env", "--y"]],
                         ids=["one-process", "module"])
def test_accelerate_one_process_and_module_forms(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "dump_env.py").write_text(Path(DUMP).read_text())
    if args[0] == "-m":
        args = ["--multi_gpu", "--num_processes", "2", *args]
    codes, own, mine = side_by_side(tmp_path, ACCELERATE, args, "--main_process_port")
    assert codes == [0, 0]
    assert_same(own, mine)
    assert ("rank-single" in mine) == (args[0] == "--cpu")


@pytest.mark.parametrize("args", [
    ["--num_gpus", "2", DUMP, "--foo", "1"],
    ["--num_gpus", "2", "--no_local_rank", "--module", "dump_env", "--bar"],
], ids=["script", "module-no-local-rank"])
def test_deepspeed_ranks_get_deepspeeds_arguments_and_environment(
        tmp_path: Path, args: list[str]) -> None:
    """``--local_rank=N`` before the script's own arguments, CROSS_*/LOCAL_SIZE, no torchrun
    variables; a ``.deepspeed_env`` where its runner looks is not read on one node, by either;
    rank 0's 4 comes back as 4 from both (deepspeed returns a failing rank's own code)."""
    (tmp_path / "dump_env.py").write_text(Path(DUMP).read_text())
    (tmp_path / ".deepspeed_env").write_text("FROM_DEEPSPEED_ENV=1\n")
    codes, own, mine = side_by_side(tmp_path, DEEPSPEED, args, "--master_port",
                                    {"DUMP_EXIT": "0=4", "HOME": str(tmp_path)})
    assert codes == [4, 4]
    assert_same(own, mine)
    env = mine["rank-1"]["env"]
    assert (env["CROSS_RANK"], env["CROSS_SIZE"], env["LOCAL_SIZE"]) == ("0", "1", "2")
    assert "FROM_DEEPSPEED_ENV" not in env and "LOCAL_WORLD_SIZE" not in env
    if "--no_local_rank" not in args:
        assert mine["rank-1"]["argv"] == ["--local_rank=1", "--foo", "1"]


def test_deepspeed_a_failing_rank_stops_the_others_at_once_with_one_grace(
        tmp_path: Path) -> None:
    """deepspeed polls once a second and gives each rank its own 30 s; forgelm-tui signals
    every other rank when the failure is seen, with one deadline."""
    proc, _ = launch(forgelm_tui(tmp_path, "--grace", "7", "deepspeed", "--num_gpus", "3",
                                    DUMP), tmp_path, "dump",
                        {"DUMP_WAIT_RANK": "0", "DUMP_EXIT": "1=7"})
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    envelope = json.loads((tmp_path / "run" / "envelope.json").read_text())
    assert envelope["stop"]["kind"] == "failure" and envelope["stop"]["grace_s"] == 7
    assert envelope["stop"]["reason"] == "rank 1 failed (exit 7)"
    assert envelope["launcher"] == {"name": "deepspeed", "rank_env": "deepspeed",
                                    "local_rank_arg": True}
    ranks = {r["rank"]: r for r in envelope["ranks"]}
    assert ranks[0]["exit_code"] == 143  # its own SIGTERM handler: the stop reached it
    assert [s["signal"] for s in ranks[0]["signals_sent"]] == ["SIGTERM"]
    assert ranks[0]["signals_sent"][0]["reason"] == "rank 1 failed (exit 7)"  # the stop's pass


@pytest.mark.parametrize(("contract", "code"), [("forgelm", 2), ("raw", 139)])
def test_deepspeed_a_signal_death_is_mapped_by_the_exit_contract(
        tmp_path: Path, contract: str, code: int) -> None:
    proc, _ = launch(forgelm_tui(tmp_path, "--exit-contract", contract, "deepspeed",
                                 "--num_gpus", "2", DUMP), tmp_path, "dump",
                     {"DUMP_EXIT": "1=SEGV"})
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out


def test_deepspeed_ranks_do_not_outlive_a_sigkilled_forgelm_tui(tmp_path: Path) -> None:
    proc, dump = launch(forgelm_tui(tmp_path, "deepspeed", "--num_gpus", "2", DUMP), tmp_path,
                        "dump", {"DUMP_WAIT_RANK": "0", "DUMP_EXIT": "1=0"})
    wait_for(lambda: (dump / "rank-0.json").exists(), 60, "rank 0 running")
    ranks = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and
             int(p.name) != proc.pid and _environ_has(int(p.name), f"DUMP_DIR={dump}")]
    assert ranks  # rank 0 (waiting for a signal), forgelm-tui's guardian, rank 1 maybe
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_for(lambda: not any(pid_alive(p) for p in ranks), 20, "the ranks gone")


def _environ_has(pid: int, entry: str) -> bool:
    try:
        return entry.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


@pytest.mark.parametrize("words", [["deepspeed", "--num_gpus", "1"],
                                   ["accelerate", "launch", "--use_deepspeed",
                                    "--num_processes", "1"]], ids=["deepspeed", "accelerate"])
def test_json_output_is_the_envelope_alone_whatever_the_launcher_logs(
        tmp_path: Path, words: list[str]) -> None:
    """deepspeed's logger writes to stdout (importing it, finding no hostfile): with
    --output-format json stdout is the envelope only; the launcher's lines go to stderr."""
    proc = subprocess.run(forgelm_tui(tmp_path, "--output-format", "json", *words, DUMP),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=cli_env({"DUMP_DIR": str(tmp_path), "HF_HOME": str(tmp_path),
                                       "ACCELERATE_USE_CPU": "true"}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    envelope = json.loads(proc.stdout)
    assert envelope == json.loads((tmp_path / "run" / "envelope.json").read_text())
    assert envelope["launcher"]["name"] == " ".join(words[:2 if words[0] == "accelerate" else 1])
