"""torchrun's options from the environment: ``PET_<DEST>`` (docs/schedulers.md, "Kubernetes").

torchrun reads every option it declares with its ``env`` action from ``PET_`` + the option's
argparse dest in upper case (``--nproc-per-node``: ``PET_NPROC_PER_NODE``) when the flag is
absent, and each flag (``check_env``: ``--standalone``, ``-m``, ``--no-python``,
``--run-path``) from an integer (``PET_STANDALONE=1``; ``0`` is off; anything else fails) (torch
2.13, torch/distributed/argparse_util.py and run.py). Kubeflow's training operator (PyTorchJob)
and Trainer (TrainJob) configure torchrun this way. forgelm-tui applies the same rule to the
same options, exactly: the flag wins over the variable; a bad value is refused with the flag's
own line, naming the variable; options torchrun gives no variable (``--logs-specs``) have none
here either, and forgelm-tui's own options have no ``PET_`` name (the one variable of its own is
``FORGELM_TUI_KILL_WAIT``). A variable of a torchrun option forgelm-tui does not take is
refused, as its flag would be, with what to use instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from forgelm_tui.plan.options import UsageError

# torchrun's env-action options that forgelm-tui takes: its dest -> (the flag, this parser's dest)
VALUES = {
    "nnodes": ("--nnodes", "nnodes"),
    "nproc_per_node": ("--nproc-per-node", "nproc_per_node"),
    "rdzv_backend": ("--rdzv-backend", "rdzv_backend"),
    "rdzv_endpoint": ("--rdzv-endpoint", "rdzv_endpoint"),
    "rdzv_id": ("--rdzv-id", "rdzv_id"),
    "rdzv_conf": ("--rdzv-conf", "rdzv_conf"),
    "max_restarts": ("--max-restarts", "max_restarts"),
    "monitor_interval": ("--monitor-interval", "ignored_monitor_interval"),
    "start_method": ("--start-method", "ignored_start_method"),
    "role": ("--role", "role"),
    "log_dir": ("--log-dir", "ignored_log_dir"),
    "redirects": ("--redirects", "ignored_redirects"),
    "tee": ("--tee", "ignored_tee"),
    "local_ranks_filter": ("--local-ranks-filter", "local_ranks_filter"),
    "node_rank": ("--node-rank", "node_rank"),
    "master_addr": ("--master-addr", "master_addr"),
    "master_port": ("--master-port", "master_port"),
    "local_addr": ("--local-addr", "ignored_local_addr"),
}
# ...and its check_env flags
FLAGS = {
    "standalone": ("--standalone", "standalone"),
    "module": ("--module", "module"),
    "no_python": ("--no-python", "no_python"),
    "run_path": ("--run-path", "run_path"),
}
# torchrun options with a variable that forgelm-tui does not take (their flags are refused too)
NOT_TAKEN = {
    "signals_to_handle": "--signals-to-handle: forgelm-tui stops every rank on SIGINT, SIGTERM "
                         "and SIGHUP and passes --forward-signals (default SIGUSR1,SIGUSR2) on",
    "shutdown_timeout": "--shutdown-timeout: use --grace (or --kill-wait)",
    "event_log_handler": "--event-log-handler: the envelope records the run",
    "duplicate_stdout_filters": "--duplicate-stdout-filters: use --local-ranks-filter",
    "duplicate_stderr_filters": "--duplicate-stderr-filters: use --local-ranks-filter",
    "virtual_local_rank": "--virtual-local-rank is not supported",
}


def variable(dest: str) -> str:
    return f"PET_{dest.upper()}"


@dataclass(frozen=True)
class FromEnv:
    """The options the environment gave: each flag and the variable it came from."""

    flags: dict[str, str]

    def explain(self, message: str) -> str:
        """A refusal of a value that came from the environment names the variable."""
        for flag, name in self.flags.items():
            if message.startswith(f"{flag} ") or f" {flag} " in message:
                return message.replace(f"{flag} ", f"{flag} (from {name}) ", 1)
        return message


def apply(ns: argparse.Namespace, options: Sequence[str], parser: argparse.ArgumentParser,
          env: Mapping[str, str]) -> FromEnv:
    """Fill the options not given on the command line from their ``PET_`` variables."""
    given = _given(options, parser)
    found: dict[str, str] = {}
    for dest, refusal in NOT_TAKEN.items():
        name = variable(dest)
        if name in env and (dest != "virtual_local_rank" or _flag(name, env[name], refusal)):
            raise UsageError(f"{name}: torchrun's {refusal}")
    for dest, (flag, own) in VALUES.items():
        name = variable(dest)
        if name in env and own not in given:
            if not env[name].strip():  # torchrun would take '' (and fail, or mean nothing)
                raise UsageError(f"{name} is empty: give {flag} a value there, or unset it")
            setattr(ns, own, env[name])
            found[flag] = name
    for dest, (flag, own) in FLAGS.items():
        name = variable(dest)
        if name in env and own not in given:
            setattr(ns, own, _flag(name, env[name], flag))
            found[flag] = name
            if dest == "module":
                found["-m"] = name  # the refusals of a module say -m
    return FromEnv(found)


def _flag(name: str, value: str, flag: str) -> bool:
    """torchrun's check_env: ``bool(int(value))``."""
    try:
        return bool(int(value))
    except ValueError:
        raise UsageError(f"{name} must be an integer as torchrun reads it (1: {flag}, 0: "
                         f"not), got {value!r}") from None


def _given(options: Sequence[str], parser: argparse.ArgumentParser) -> set[str]:
    """The dests of the options on the command line (``--nnodes 2``, ``--nnodes=2``)."""
    by_string = {s: a.dest for a in parser._actions for s in a.option_strings}
    given = set()
    for token in options:
        name = token.split("=", 1)[0] if token.startswith("--") else token
        if name in by_string:
            given.add(by_string[name])
    return given
