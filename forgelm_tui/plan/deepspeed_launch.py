"""``forgelm-tui deepspeed ARGS``: DeepSpeed's launcher's command, run by forgelm-tui
(issue 26; docs/launchers.md, "deepspeed").

Read with DeepSpeed's own parser and resource functions (``deepspeed.launcher.runner``: the
hostfile, ``--include``/``--exclude``, ``--num_nodes``/``--num_gpus``, the accelerator's device
count and visible-devices variable), so the ranks are the ones its launcher would start, on
the same devices, with its environment (``CROSS_RANK``, ``CROSS_SIZE``, ``LOCAL_SIZE``, no
torchrun variables: engine/spec.py) and ``--local_rank=N`` after the script unless
``--no_local_rank``.

One node, or every node running the same command (``--no_ssh --node_rank N`` with a hostfile,
DeepSpeed's own way to be started on each node by a scheduler). Its pdsh/ssh/MPI runners start
the other nodes themselves: refused with the form to use instead. ``.deepspeed_env`` is read
by those runners only, so never here, as under ``deepspeed`` for the forms that run.
"""

from __future__ import annotations

import argparse
import collections
import os
from collections.abc import Sequence
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

NAME = "deepspeed"
# Flags of DeepSpeed's launcher that change what runs, which forgelm-tui does not do.
REFUSED = {
    "autotuning": "the autotuner runs experiments of its own; run it with deepspeed itself",
    "bind_cores_to_rank": "numactl core binding is not supported",
    "bind_core_list": "numactl core binding is not supported",
    "force_multi": "the multi-node runner starts other nodes over ssh; start forgelm-tui on "
                   "every node instead (docs/launchers.md)",
    "save_pid": "forgelm-tui's own pid is the job's (its envelope names every rank's)",
}
MULTI_NODE = ("forgelm-tui runs the ranks of one node: start it on every node, e.g. "
              "srun forgelm-tui deepspeed --hostfile H --no_ssh --node_rank $SLURM_NODEID "
              "--master_addr ADDR ... (DeepSpeed's own --no_ssh form), or forgelm-tui --nnodes "
              "N --node-rank $SLURM_NODEID --master-addr ADDR ... (docs/launchers.md)")


def translate(args: Sequence[str]) -> Translated:
    try:
        from deepspeed.launcher import runner
    except ImportError:
        raise missing("deepspeed", "deepspeed") from None
    with parser_errors(NAME):
        ns = runner.parse_args(list(args))
    for dest, why in REFUSED.items():
        if getattr(ns, dest, None) not in (None, False, ""):
            raise UsageError(f"forgelm-tui {NAME} --{dest}: {why}")
    program = program_words(NAME, ns.module, ns.no_python)
    nodes, node_rank, master_addr = _resources(runner, ns)
    devices = nodes[list(nodes)[node_rank]]
    if any(len(slots) != len(devices) for slots in nodes.values()):
        raise UsageError(f"{NAME}: every node must run as many ranks for forgelm-tui "
                         f"({ {h: len(s) for h, s in nodes.items()} })")
    words = ["--nproc-per-node", str(len(devices)), "--master-addr", master_addr,
             "--master-port", str(ns.master_port)]
    notices: list[str] = []
    if len(nodes) > 1:
        words += ["--nnodes", str(len(nodes)), "--node-rank", str(node_rank)]
    else:
        words, notices = one_node(NAME, words, "--hostfile, --no_ssh, --node_rank "
                                  "$SLURM_NODEID and --master_addr (docs/launchers.md)")
    words += program
    if ns.enable_each_rank_log not in (None, "None"):
        notices.append(f"{NAME} --enable_each_rank_log {ns.enable_each_rank_log}: each rank's "
                       "output is in forgelm-tui's run dir (rank-N.stdout.log) instead")
    return Translated(NAME, [*words, ns.user_script, *ns.user_args],
                      env=_visible_devices(devices), env_style="deepspeed",
                      local_rank_arg=not ns.no_local_rank, notices=notices)


def _resources(runner: Any, ns: argparse.Namespace) -> tuple[dict[str, list[int]], int, str]:
    """The nodes and their device ids, this node's rank among them and node 0's address, as
    DeepSpeed's runner computes them (its ``main``)."""
    pool = launcher_call(NAME, lambda: runner.fetch_hostfile(ns.hostfile))
    accelerator = _accelerator()
    visible_var = accelerator.visible_devices_envs()[0]
    visible = os.environ.get(visible_var, "")
    filters = bool(ns.include or ns.exclude or ns.num_nodes > 1 or ns.num_gpus > 0)
    if not pool and visible and not filters:
        ns.include = f"localhost:{visible}"  # deepspeed: the visible devices, renumbered below
    if (ns.num_nodes >= 0 or ns.num_gpus >= 0) and (ns.include or ns.exclude):
        raise UsageError(f"{NAME}: cannot specify --num_nodes/--num_gpus with "
                         "--include/--exclude")
    if not pool:
        count = _device_count(accelerator, visible_var, visible)
        if count == 0:
            raise UsageError(f"{NAME}: no GPU resources available")
        pool = collections.OrderedDict(localhost=count)
        if ns.num_nodes > 1:
            raise UsageError(f"{NAME}: --num_nodes {ns.num_nodes} but no other nodes are "
                             "given (a hostfile)")
        ns.master_addr = "127.0.0.1"
    active = launcher_call(NAME, lambda: runner.parse_inclusion_exclusion(
        pool, ns.include, ns.exclude))
    active = runner.apply_num_nodes_and_gpus(active, ns.num_nodes, ns.num_gpus)
    if not active:
        raise UsageError(f"{NAME}: no nodes left to run on")
    if ns.no_ssh and not 0 <= ns.node_rank < len(active):
        raise UsageError(f"{NAME} --no_ssh: --node_rank must be 0..{len(active) - 1} "
                         f"(got {ns.node_rank})")
    if len(active) == 1:
        return dict(active), 0, ns.master_addr or "127.0.0.1"
    if not ns.no_ssh:
        raise UsageError(f"forgelm-tui {NAME} with {len(active)} hosts in {ns.hostfile}: "
                         f"DeepSpeed's {ns.launcher} runner would start them; {MULTI_NODE}")
    if not ns.master_addr:
        raise UsageError(f"{NAME} --no_ssh: give --master_addr (node 0's address; deepspeed "
                         "would ask it over ssh)")
    return dict(active), ns.node_rank, ns.master_addr


def _device_count(accelerator: Any, visible_var: str, visible: str) -> int:
    """The accelerator's devices as DeepSpeed's runner counts them: with the visible-devices
    variable removed first (it deletes it; the devices it named are then ``--include``d)."""
    if not visible:
        return int(accelerator.device_count())
    del os.environ[visible_var]
    try:
        return int(accelerator.device_count())
    finally:
        os.environ[visible_var] = visible


def _visible_devices(devices: list[int]) -> dict[str, str]:
    """The accelerator's visible-devices variable for this node's device ids, as
    ``deepspeed.launcher.launch`` sets it for every rank."""
    env: dict[str, str] = {}
    _accelerator().set_visible_devices_envs(env, devices)
    return env


def _accelerator() -> Any:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()
