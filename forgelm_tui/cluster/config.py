"""The multi-node part of the command line (torchrun's spellings) or of an srun step, checked
before anything starts. Pure: the argparse namespace and the environment in, a config out."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, replace

from forgelm_tui import __version__
from forgelm_tui.cluster.slurm import SlurmError, default_port, in_srun_step, read_step
from forgelm_tui.plan.options import UsageError, parse_port
from forgelm_tui.plan.rdzv_conf import RdzvConf, parse_rdzv_conf

CONTROL_PORT_OFFSET = 1  # the control store: MASTER_PORT + 1 unless --rdzv-endpoint gives one


@dataclass(frozen=True)
class ClusterConfig:
    """This node's multi-node settings, as the command line, SLURM or defaults gave them."""

    nnodes: int
    node_rank: int | None  # None: from the order of joining (c10d without --node-rank)
    store_host: str
    store_port: int
    master_addr: str
    master_port: int | None  # None: node 0 picks a free one and publishes it (c10d)
    run_id: str  # this node's proposal; node 0's is adopted unless fixed
    run_id_fixed: bool  # --rdzv-id or SLURM's job and step: every node already agrees
    nproc: int
    join_timeout: float = 300.0
    node_timeout: float = 10.0
    backend: str = "static"
    source: str = "flags"  # flags | slurm
    version: str = __version__
    # --rdzv-conf (plan/rdzv_conf.py): the elastic join window, one store call's wait, node
    # 0's wait for the others to read the verdict, and who hosts the store (None: node 0)
    last_call: float = 30.0
    call_wait: float = 10.0
    ack_wait: float = 5.0
    is_host: bool | None = None
    min_nodes: int = 0  # --nnodes MIN:MAX (nnodes is MAX); 0: a fixed count

    @property
    def elastic(self) -> bool:
        return 0 < self.min_nodes < self.nnodes


def parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` (torchrun's elastic range): (MIN, MAX)."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high) if sep else int(low)
    except ValueError:
        raise UsageError(f"--nnodes must be N or MIN:MAX, got {text!r}") from None
    if lo < 1:
        raise UsageError(f"--nnodes must be at least 1, got {lo}")
    if hi < lo:
        raise UsageError(f"--nnodes {text}: MAX is below MIN")
    return lo, hi


def _port(text: str, what: str) -> int:
    return parse_port(text, what, highest=65534)  # the control store takes the next one


def _endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise UsageError(f"--rdzv-endpoint must be HOST:PORT, got {text!r}")
    return _host(host.strip("[]"), "--rdzv-endpoint"), _port(port, "--rdzv-endpoint's port")


def _host(text: str, what: str) -> str:
    """A name that can resolve one day (it may not yet: the join waits), or an address."""
    bare = text.strip("[]")  # an IPv6 address as torchrun spells it: [::1]
    try:
        if bare and not any(c.isspace() for c in bare) and bare.encode("idna"):
            return text
    except UnicodeError:
        pass
    raise UsageError(f"{what} {text!r} is not a host name or address (empty, a space, an empty "
                     "label or one over 63 characters)")


def uses_slurm(ns: argparse.Namespace, env: Mapping[str, str]) -> bool:
    """Inside an srun step with none of the multi-node flags given: SLURM configures it."""
    flags = (ns.node_rank, ns.master_addr, ns.rdzv_endpoint)
    return in_srun_step(env) and ns.nnodes is None and all(f is None for f in flags)


def cluster_config(ns: argparse.Namespace, nproc: int, run_id: str,
                   env: Mapping[str, str]) -> ClusterConfig | None:
    """None for a single-node run; the checked multi-node config otherwise."""
    conf = parse_rdzv_conf(ns.rdzv_conf)  # refused by name even on one node
    config = (_from_slurm(ns, nproc, run_id, env) if uses_slurm(ns, env)
              else _from_flags(ns, nproc, run_id))
    return None if config is None else _with_conf(config, conf, ns)


def _with_conf(config: ClusterConfig, conf: RdzvConf, ns: argparse.Namespace) -> ClusterConfig:
    """forgelm-tui's own flags first, then --rdzv-conf's keys, then the defaults."""
    if conf.is_host is not None and config.node_rank is not None and \
            conf.is_host != (config.node_rank == 0):
        raise UsageError(f"--rdzv-conf is_host={int(conf.is_host)}: node {config.node_rank} "
                         f"{'does not host' if conf.is_host else 'hosts'} the control store "
                         "(node 0 does)")
    join = ns.join_timeout if ns.join_timeout is not None else conf.join_timeout
    node = ns.node_timeout if ns.node_timeout is not None else conf.node_timeout
    return replace(
        config, join_timeout=_positive(300.0 if join is None else join, "--join-timeout"),
        node_timeout=_positive(10.0 if node is None else node, "--node-timeout"),
        last_call=conf.last_call_timeout or 30.0, call_wait=conf.read_timeout or 10.0,
        ack_wait=conf.close_timeout or 5.0, is_host=conf.is_host)


def _from_flags(ns: argparse.Namespace, nproc: int, run_id: str) -> ClusterConfig | None:
    min_nodes, nnodes = parse_nnodes(ns.nnodes or "1")
    node_rank = None if ns.node_rank is None else _node_rank(ns.node_rank, nnodes)
    if nnodes == 1:
        if node_rank not in (None, 0):
            raise UsageError(f"--node-rank {node_rank} with one node: use 0")
        return None
    backend = ns.rdzv_backend or "static"
    if backend not in ("static", "c10d"):
        raise UsageError(f"--rdzv-backend {backend}: use static or c10d")
    if min_nodes < nnodes and (backend != "c10d" or not ns.rdzv_endpoint):
        raise UsageError(f"--nnodes {ns.nnodes} (elastic) needs --rdzv-backend c10d and "
                         "--rdzv-endpoint HOST:PORT, as torchrun's")
    if node_rank is None and backend == "static":
        raise UsageError("--node-rank is required with --nnodes > 1 (or --rdzv-backend c10d, "
                         "which numbers nodes in the order they join)")
    if ns.rdzv_endpoint:
        store_host, store_port = _endpoint(ns.rdzv_endpoint)
        master_addr = _host(ns.master_addr, "--master-addr") if ns.master_addr else store_host
        # None: node 0 picks a free one on its machine for each attempt and publishes it
        # (torchrun's c10d rendezvous: a restart never meets the old rank 0's port)
        master_port = _port(ns.master_port, "--master-port") if ns.master_port else None
    else:
        if ns.master_addr is None or ns.master_port is None:
            raise UsageError("--nnodes > 1 needs --master-addr and --master-port (node 0's "
                             "address, as torchrun's static rendezvous), or --rdzv-endpoint")
        master_addr = _host(ns.master_addr, "--master-addr")
        master_port = _port(ns.master_port, "--master-port")
        store_host, store_port = master_addr.strip("[]"), master_port + CONTROL_PORT_OFFSET
    return ClusterConfig(
        nnodes=nnodes, node_rank=node_rank, store_host=store_host, store_port=store_port,
        master_addr=master_addr, master_port=master_port, run_id=ns.rdzv_id or run_id,
        run_id_fixed=bool(ns.rdzv_id), nproc=nproc, backend=backend, min_nodes=min_nodes)


def _from_slurm(ns: argparse.Namespace, nproc: int, run_id: str,
                env: Mapping[str, str]) -> ClusterConfig | None:
    try:
        step = read_step(env)
    except SlurmError as exc:
        raise UsageError(str(exc)) from None
    if step.nnodes == 1:
        return None
    port = (_port(ns.master_port, "--master-port") if ns.master_port
            else default_port(step.job_id, step.step_id))
    return ClusterConfig(
        nnodes=step.nnodes, node_rank=step.node_rank, store_host=step.master_addr,
        store_port=port + CONTROL_PORT_OFFSET, master_addr=step.master_addr, master_port=port,
        run_id=ns.rdzv_id or step.run_id, run_id_fixed=True, nproc=nproc, source="slurm")


def _node_rank(text: str, nnodes: int) -> int:
    try:
        rank = int(text)
    except ValueError:
        raise UsageError(f"--node-rank must be a whole number, got {text!r}") from None
    if not 0 <= rank < nnodes:
        raise UsageError(f"--node-rank {rank} is outside 0..{nnodes - 1} (--nnodes {nnodes})")
    return rank


def _positive(value: float, what: str) -> float:
    if value <= 0:
        raise UsageError(f"{what} must be more than 0 seconds")
    return float(value)
