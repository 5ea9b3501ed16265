"""``forgelm-tui accelerate launch ARGS``: accelerate's command, run by forgelm-tui (issue 26;
docs/launchers.md, "accelerate launch").

accelerate decides what its ranks get from its flags and its config file (the default one,
``--config_file``): mixed precision, dynamo, FSDP, DeepSpeed, Megatron-LM and parallelism
settings travel to every rank as ``ACCELERATE_*``/``FSDP_*``/``MEGATRON_LM_*`` variables, the
ranks' count and rendezvous as torchrun's arguments. Both are computed here by accelerate's own
functions (its parser, ``_validate_launch_command``, ``prepare_multi_gpu_env``,
``prepare_deepspeed_cmd_env``, ``prepare_simple_launcher_cmd_env``, ``_filter_args``), exactly
as its ``launch_command`` does; forgelm-tui then starts the ranks itself. Some of those are
private to accelerate: the versions tested are pinned (``forgelm-tui[accelerate]``), another
version is refused in one line.

What accelerate runs with torchrun (multi-GPU, FSDP, Megatron-LM, DeepSpeed on one node or
``deepspeed_multinode_launcher: standard``) gets torchrun's rank environment; its one-process
launcher (no distributed type, ``--cpu``) one process with no rank variables, as accelerate
starts it. Its TPU, SageMaker and mpirun launchers, and DeepSpeed's pdsh/ssh/MPI multi-node
launchers, start machines or processes forgelm-tui does not: refused with the form to use.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from forgelm_tui.plan.options import UsageError
from forgelm_tui.plan.translated import (
    Translated,
    launcher_call,
    missing,
    one_node,
    parser_errors,
    program_words,
)

NAME = "accelerate launch"
EXTRA = "forgelm-tui[accelerate]"
TESTED = ((1, 10), (1, 16))  # the minor versions whose private functions were tested
# torchrun's options accelerate sets that forgelm-tui spells the same way (plan/options.py)
SHOWN = {"nnodes": "--nnodes", "nproc_per_node": "--nproc-per-node", "node_rank": "--node-rank",
         "master_addr": "--master-addr", "master_port": "--master-port",
         "rdzv_backend": "--rdzv-backend", "rdzv_endpoint": "--rdzv-endpoint",
         "rdzv_id": "--rdzv-id", "rdzv_conf": "--rdzv-conf", "max_restarts": "--max-restarts",
         "monitor_interval": "--monitor-interval", "start_method": "--start-method",
         "role": "--role", "log_dir": "--log-dir", "redirects": "--redirects", "tee": "--tee",
         "local_ranks_filter": "--local-ranks-filter"}
FLAGS = {"standalone": "--standalone", "run_path": "--run-path"}
# what torchrun's --standalone replaces (accelerate sets it when its port is taken on one node)
STANDALONE_SETS = ("master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id")
HOW = "--num_machines, --machine_rank and --main_process_ip (docs/launchers.md)"
MULTI_NODE = ("start forgelm-tui on every node instead, with deepspeed_multinode_launcher: "
              "standard (or --num_machines/--machine_rank/--main_process_ip), e.g. under srun "
              "(docs/launchers.md)")


def translate(args: Sequence[str]) -> Translated:
    acc, utils = _modules()
    with parser_errors(NAME):
        ns = acc.launch_command_parser().parse_args(list(args))
    ns, defaults, mp_from_config = launcher_call(NAME, lambda: acc._validate_launch_command(ns))
    if ns.use_deepspeed and not ns.cpu:
        return _deepspeed(utils, ns, defaults, mp_from_config)
    if (ns.use_fsdp or ns.use_megatron_lm or ns.multi_gpu) and not ns.cpu:
        env = launcher_call(NAME, lambda: utils.prepare_multi_gpu_env(ns))
        return _torchrun(utils, ns, _p2p(utils, env))
    if ns.tpu and not ns.cpu:
        raise UsageError(f"forgelm-tui {NAME}: accelerate's TPU launcher is not supported")
    if defaults is not None and str(defaults.compute_environment) == "AMAZON_SAGEMAKER":
        raise UsageError(f"forgelm-tui {NAME}: the SageMaker launcher runs the job on AWS, "
                         "not here; forgelm-tui cannot stand in front of it")
    if getattr(ns, "mpirun_hostfile", None):
        raise UsageError(f"forgelm-tui {NAME} --mpirun_hostfile: mpirun starts the processes; "
                         f"{MULTI_NODE}")
    _, env = launcher_call(NAME, lambda: utils.prepare_simple_launcher_cmd_env(ns))
    program = program_words(NAME, ns.module, ns.no_python)
    words, notices = one_node(NAME, ["--nproc-per-node", "1", *program, ns.training_script,
                                     *ns.training_script_args], HOW)
    return Translated(NAME, words, env=_added(env), env_style="single", notices=notices)


def _deepspeed(utils: Any, ns: argparse.Namespace, defaults: Any,
               mp_from_config: bool) -> Translated:
    """accelerate's DeepSpeed launcher on one node (or ``standard`` multi-node): torchrun's
    ranks with ``ACCELERATE_USE_DEEPSPEED`` and the config's fields, as its launch_command."""
    try:  # as accelerate's deepspeed_launcher (importing deepspeed sets a variable or two)
        import deepspeed.launcher.runner  # noqa: F401
    except ImportError:
        raise missing("DeepSpeed", "deepspeed") from None
    fields = list(defaults.deepspeed_config.keys()) if defaults else []
    if mp_from_config:
        fields.append("mixed_precision")
    ns.deepspeed_fields_from_accelerate_config = ",".join(fields)
    multinode = ns.deepspeed_multinode_launcher or "pdsh"
    if ns.num_machines > 1 and multinode not in ("standard", "nossh"):
        raise UsageError(f"forgelm-tui {NAME}: DeepSpeed's {multinode} multi-node launcher "
                         f"starts the other machines itself; {MULTI_NODE}")
    cmd, env = launcher_call(NAME, lambda: utils.prepare_deepspeed_cmd_env(ns))
    if cmd is None:
        return _torchrun(utils, ns, _p2p(utils, env))
    # nossh: accelerate runs `deepspeed --hostfile H --node_rank R --no_ssh ...` on each
    # machine with its environment; that command is read as forgelm-tui deepspeed reads it
    from forgelm_tui.plan import deepspeed_launch

    ranks = deepspeed_launch.translate(cmd[1:])
    return dataclasses.replace(ranks, launcher=NAME, env={**_added(_p2p(utils, env)),
                                                          **ranks.env})


def _torchrun(utils: Any, ns: argparse.Namespace, env: dict[str, str]) -> Translated:
    """accelerate's torchrun arguments (its ``_filter_args``) in forgelm-tui's spellings: what
    differs from torchrun's defaults, then the program."""
    import torch.distributed.run as distrib_run

    parser = distrib_run.get_args_parser()
    script = ["--training_script", ns.training_script, "--training_script_args",
              ns.training_script_args]
    torchrun = utils._filter_args(ns, parser, script)
    default, _ = parser.parse_known_args(script)
    words: list[str] = []
    nodes = str(getattr(torchrun, "nnodes", "1")) not in ("1", "1:1")
    if nodes and "None" in (str(torchrun.master_addr), str(torchrun.rdzv_endpoint)[:4]):
        raise UsageError(f"{NAME} --num_machines {torchrun.nnodes}: give --main_process_ip "
                         "(the main machine's address)")
    for dest, flag in SHOWN.items():
        value = getattr(torchrun, dest, None)
        if torchrun.standalone and dest in STANDALONE_SETS:
            continue  # torchrun's --standalone: a free port on localhost, whatever was given
        if value is not None and (str(value) != str(getattr(default, dest, None)) or
                                  (dest == "node_rank" and nodes)):
            words += [flag, str(value)]
    for dest, flag in FLAGS.items():
        if getattr(torchrun, dest, False):
            words.append(flag)
    words += [*program_words(NAME, ns.module, ns.no_python), ns.training_script,
              *ns.training_script_args]
    words, notices = (words, []) if nodes else one_node(NAME, words, HOW)
    return Translated(NAME, words, env=_added(env), notices=notices)


def _p2p(utils: Any, env: dict[str, str]) -> dict[str, str]:
    """accelerate's own: consumer GPUs without P2P/IB get NCCL_P2P_DISABLE/NCCL_IB_DISABLE."""
    if not utils.check_cuda_p2p_ib_support():
        env.setdefault("NCCL_P2P_DISABLE", "1")
        env.setdefault("NCCL_IB_DISABLE", "1")
    return env


def _added(env: dict[str, str]) -> dict[str, str]:
    """What accelerate added to (or changed in) this environment for its ranks."""
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


def _modules() -> tuple[Any, Any]:
    try:
        version = metadata.version("accelerate")
    except metadata.PackageNotFoundError:
        raise missing("accelerate", EXTRA) from None
    minor = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if not TESTED[0] <= minor <= TESTED[1]:
        low, high = (".".join(map(str, v)) for v in TESTED)
        raise UsageError(f"accelerate {version} is not a version forgelm-tui was tested with "
                         f"({low} to {high}.x): pip install '{EXTRA}'")
    try:
        from accelerate import utils
        from accelerate.commands import launch as acc
    except ImportError as exc:
        raise UsageError(f"accelerate {version} cannot be imported ({exc}): pip install "
                         f"'{EXTRA}'") from None
    return acc, utils
