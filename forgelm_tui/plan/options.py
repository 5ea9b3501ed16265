"""The command line's vocabulary: torchrun's spellings, ForgeLM mode, the demo; parsing helpers.

No decisions about a run here (plan.py) and no running (cli.py, run.py)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from forgelm_tui import __version__
from forgelm_tui.channel import STACKS_SIGNAL
from forgelm_tui.signames import signal_name, signal_number

FORGELM_MODULES = ("forgelm", "forgelm.cli")
DEFAULT_RUN_ROOT = "forgelm-tui-runs"
DEMO_MODULE = "forgelm_tui.demo.train"


class UsageError(Exception):
    """Bad input from the operator: reported in one line, exit 1, no rank started."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


EPILOG = """\
forms:
  forgelm-tui [options] --config job.yaml [forgelm args]   ForgeLM: python -m forgelm.cli ...
  forgelm-tui [options] forgelm --config job.yaml ...      the same (ForgeLM's template form)
  forgelm-tui [options] train.py [args]                    a script, as torchrun runs it
  forgelm-tui [options] -m package.module [args]           a module, as torchrun -m
  forgelm-tui [options] --no-python program [args]         any executable
  forgelm-tui [options] torchrun|deepspeed|accelerate launch ARGS   the launcher's command
  forgelm-tui demo [options] [demo options]                a small CPU DDP run (gloo)

exit codes: the run's true code (ForgeLM's contract: 0 success, 1 config error, 2 training
error, 3 gate failed, 4 awaiting approval, 5 wizard cancelled, 6 integrity failure).
A JSON envelope describing the run is written to the run directory.
"""


def _add_rendezvous_options(tr: argparse._ArgumentGroup) -> None:
    tr.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default=None,
                    metavar="HOST:PORT", help="the control store (node 0); MASTER_PORT "
                                              "defaults to PORT+1")
    tr.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default=None,
                    help="static (needs --node-rank) or c10d (nodes numbered as they join)")
    tr.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", default=None,
                    help="the run id every node uses (default: node 0's)")
    tr.add_argument("--rdzv-conf", "--rdzv_conf", dest="rdzv_conf", default=None,
                    metavar="K=V,...", help="torchrun's rendezvous keys: honoured or refused "
                    "by name (docs/multinode.md)")


def _add_node_timeouts(own: argparse._ArgumentGroup) -> None:
    own.add_argument("--join-timeout", type=float, default=None, metavar="S",
                     help="multi-node: how long nodes wait for each other to join (300; "
                          "or --rdzv-conf join_timeout)")
    own.add_argument("--node-timeout", type=float, default=None, metavar="S",
                     help="multi-node: a node silent this long is lost and the run stops (10; "
                          "or --rdzv-conf keep_alive_interval x keep_alive_max_attempt)")


def _add_grace(own: argparse._ArgumentGroup) -> None:
    own.add_argument("--grace", type=float, default=None, metavar="S",
                     help="SIGTERM -> SIGKILL wait when stopping, in seconds (default 30; "
                          "under a scheduler its kill window less 5 s: docs/schedulers.md)")
    own.add_argument("--kill-wait", type=float, default=None, metavar="S",
                     help="the scheduler's SIGTERM -> SIGKILL window, where it cannot be read "
                          "(also FORGELM_TUI_KILL_WAIT; under SLURM: KillWait)")


def _add_rank_runtime(own: argparse._ArgumentGroup) -> None:
    """What forgelm-tui runs a Python rank under: the graceful runner, the collectives trace."""
    own.add_argument("--collective-trace", choices=("on", "off"), default="on",
                     help="Python ranks: how many collectives each process group entered counts "
                          "as progress and names a hang (default on; docs/progress.md)")
    graceful = own.add_mutually_exclusive_group()
    graceful.add_argument("--graceful", dest="graceful", action="store_true", default=None,
                          help="run Python ranks so that SIGTERM raises an exception in the "
                               "main thread (cleanup runs); default on in ForgeLM mode")
    graceful.add_argument("--no-graceful", dest="graceful", action="store_false",
                          help="leave SIGTERM as the program handles it")


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
    tr = parser.add_argument_group("torchrun-compatible options")
    tr.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                    metavar="N", help="ranks on this node: a number, 'cpu', 'gpu' or 'auto'")
    tr.add_argument("--nnodes", default=None,
                    help="nodes: N or MIN:MAX (elastic, with c10d; default 1, or SLURM's)")
    tr.add_argument("--node-rank", "--node_rank", dest="node_rank", default=None,
                    help="this node's rank (0 hosts the control store)")
    tr.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None,
                    help="node 0's address (default 127.0.0.1 on one node)")
    tr.add_argument("--master-port", "--master_port", dest="master_port",
                    help="rank 0's port (default: a free one on one node); control: the next")
    _add_rendezvous_options(tr)
    tr.add_argument("--standalone", action="store_true", help="single node, free port")
    tr.add_argument("--run-path", "--run_path", dest="run_path", action="store_true",
                    help="accepted for torchrun compatibility; the script runs as with python")
    tr.add_argument("-m", "--module", action="store_true", help="run a module, as python -m")
    tr.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                    help="run the program directly, not through python")
    tr.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", default="0",
                    metavar="N", help="restart every node's ranks up to N times after a "
                    "crash, an outside signal or a stall (never 1, 3-6, a cancel; 0)")
    tr.add_argument("--role", default="default", help="the ranks' ROLE_NAME (torchrun's)")
    for spelling in ("log-dir", "start-method", "monitor-interval", "local-addr", "logs-specs"):
        tr.add_argument(f"--{spelling}", f"--{spelling.replace('-', '_')}",
                        dest=f"ignored_{spelling.replace('-', '_')}", help=argparse.SUPPRESS)
    tr.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="local_ranks_filter",
                    default=None, metavar="L",
                    help="--no-tui: print the output of these local ranks only (0,1); every "
                         "rank's state lines still print, the rank logs keep every line")
    for short, name in (("-r", "redirects"), ("-t", "tee")):
        tr.add_argument(short, f"--{name}", dest=f"ignored_{name}", help=argparse.SUPPRESS)

    own = parser.add_argument_group("forgelm-tui options")
    _add_node_timeouts(own)
    _add_restart_backoff(own)
    _add_grace(own)
    own.add_argument("--drain", type=float, default=60.0, metavar="S",
                     help="after rank 0 ends with an outcome, how long the others may take "
                          "(default 60)")
    own.add_argument("--stall-timeout", type=float, default=None, metavar="S",
                     help="stop with code 2 when no rank shows progress for S seconds (off)")
    own.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                     help=f"logs and envelope (default ./{DEFAULT_RUN_ROOT}/RUN_ID)")
    own.add_argument("--envelope", type=Path, default=None, metavar="PATH",
                     help="also write the JSON envelope here")
    view = own.add_mutually_exclusive_group()
    view.add_argument("--no-tui", dest="tui", action="store_false", default=None,
                      help="plain rank-prefixed lines (default when not a terminal or CI set)")
    view.add_argument("--tui", dest="tui", action="store_true", help="the interactive view")
    own.add_argument("--output-format", choices=("text", "json"), default="text",
                     help="json: print the envelope, and only it, on stdout")
    own.add_argument("--exit-contract", choices=("forgelm", "raw"), default="forgelm",
                     help="forgelm: codes outside 0..6 become 2; raw: keep them, 128+N for "
                          "a signal")
    own.add_argument("--forward-signals", default="SIGUSR1,SIGUSR2", metavar="LIST",
                     help="signals passed to every rank without stopping (or 'none')")
    _add_rank_runtime(own)
    own.add_argument("--version", action="version", version=f"forgelm-tui {__version__}")


def build_parser(demo: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="forgelm-tui demo" if demo else "forgelm-tui",
        description="Launch torch.distributed ranks like torchrun, watch them, stop them "
                    "together, and exit with the run's true code.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    _add_launch_options(parser)
    if demo:
        from forgelm_tui.demo.options import add_demo_options

        add_demo_options(parser)
    return parser


@dataclass
class Target:
    mode: str  # forgelm | script | module | program | demo
    args: list[str]  # the target and its arguments, as typed
    options: list[str] = field(default_factory=list)  # supervisor options


def split_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> tuple[list[str], Target]:
    """Split supervisor options from the target, the way torchrun does (first positional)."""
    takes_value = {
        opt: action.nargs != 0
        for action in parser._actions
        for opt in action.option_strings
    }
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":
            return list(argv[:index]), _target(list(argv[index + 1 :]))
        if token == "--config" or token.startswith("--config="):
            return list(argv[:index]), Target("forgelm", ["forgelm", *argv[index:]])
        if not token.startswith("-") or token == "-":
            return list(argv[:index]), _target(list(argv[index:]))
        name = token.split("=", 1)[0]
        if takes_value.get(name) and "=" not in token:
            index += 1
        index += 1
    return list(argv), Target("none", [])


def _target(rest: list[str]) -> Target:
    if not rest:
        return Target("none", [])
    if rest[0] == "demo":
        return Target("demo", rest)
    return Target("script", rest)


def parse_count(text: str | None, what: str, default: int) -> int:
    """A rank count as torchrun reads ``--nproc-per-node``: a number, ``cpu`` (the CPU count),
    ``gpu`` (the GPUs CUDA_VISIBLE_DEVICES shows; an error without one, as torchrun's "Cuda
    is not available") or ``auto`` (those GPUs when there are any, else the CPU count)."""
    if text is None:
        return default
    if text == "cpu":
        return _cpu_count()
    if text in ("gpu", "auto"):
        gpus = _gpu_count()
        if gpus:
            return gpus
        if text == "gpu":
            raise UsageError(f"{what} gpu: no GPU visible here (NVML found none, or "
                             "CUDA_VISIBLE_DEVICES hides them all)")
        return _cpu_count()
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{what} must be a whole number, 'cpu', 'gpu' or 'auto', "
                         f"got {text!r}") from None
    if value < 1:
        raise UsageError(f"{what} must be at least 1, got {value}")
    return value


def _add_restart_backoff(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--restart-backoff", type=float, default=1.0, metavar="S",
                       help="wait before the first restart, doubled each time, at most 30 s "
                            "(default 1)")


def parse_local_ranks(text: str | None, nproc: int) -> frozenset[int] | None:
    """--local-ranks-filter ``0,1``: local ranks of this node, as torchrun spells them."""
    if text is None:
        return None
    what = "--local-ranks-filter"
    try:
        ranks = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"{what} must be local ranks separated by commas (0,1), "
                         f"got {text!r}") from None
    beyond = sorted(r for r in ranks if not 0 <= r < nproc)
    if beyond:
        raise UsageError(f"{what} {text}: each node runs local ranks 0-{nproc - 1}, not "
                         f"{', '.join(map(str, beyond))}")
    return ranks


def parse_restarts(text: str) -> int:
    """--max-restarts: a whole number >= 0 (more than 0 only on one node: plan.py)."""
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--max-restarts must be a whole number, got {text!r}") from None
    if value < 0:
        raise UsageError(f"--max-restarts must not be negative, got {value}")
    return value
def _cpu_count() -> int:
    """The CPUs this process may run on, as torchrun counts them (affinity, then the count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _gpu_count() -> int:
    """NVML's devices as CUDA_VISIBLE_DEVICES filters them: no torch import here."""
    from forgelm_tui.engine.gpu import visible_gpu_count  # only when asked

    return visible_gpu_count(os.environ)


def parse_signals(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    result = []
    for name in text.split(","):
        sig = signal_number(name)
        if sig is None or not _catchable(sig):
            raise UsageError(f"--forward-signals: unknown signal {name.strip()!r}")
        if sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(f"--forward-signals: {signal_name(sig)} stops the run; it cannot "
                             "be forwarded")
        if sig == STACKS_SIGNAL:
            raise UsageError(f"--forward-signals: {signal_name(sig)} is reserved for capturing "
                             "the ranks' stacks; it cannot be forwarded")
        result.append(sig)
    return tuple(result)


def _catchable(sig: int) -> bool:
    """A signal the supervisor can install a handler for: a named one or a real-time one
    (glibc reserves 32 and 33 for itself)."""
    rtmin, rtmax = int(getattr(signal, "SIGRTMIN", 34)), int(getattr(signal, "SIGRTMAX", 64))
    try:
        signal.Signals(sig)
    except ValueError:
        return rtmin <= sig <= rtmax
    return sig not in (signal.SIGKILL, signal.SIGSTOP)


def check_port(addr: str, port_text: str | None) -> int:
    """The rendezvous port: the one given if it is free, else a free one."""
    if port_text is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port
    port = parse_port(port_text, "--master-port")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("" if addr in ("127.0.0.1", "localhost") else addr, port))
        except OSError as exc:
            raise UsageError(
                f"--master-port {port}: cannot listen on {addr}:{port} ({exc.strerror}); "
                "is another job using it?"
            ) from None
    return port


def parse_port(text: str, what: str, lowest: int = 1, highest: int = 65535) -> int:
    """A port number from the command line, or one clear line."""
    try:
        port = int(text)
    except ValueError:
        raise UsageError(f"{what} must be a number, got {text!r}") from None
    if not lowest <= port <= highest:
        raise UsageError(f"{what} must be {lowest}..{highest}, got {port}")
    return port


def _run_arguments(parser: argparse.ArgumentParser, read_only: str) -> None:
    """What attach and serve share: the run, and watching only."""
    parser.add_argument("run", nargs="?", default=None, metavar="RUN_DIR | RUN_ID",
                        help="the run (default: the newest live one)")
    parser.add_argument("--read-only", action="store_true", help=read_only)


def viewer_parser(command: str) -> argparse.ArgumentParser:
    """`forgelm-tui attach`, `forgelm-tui serve` and `forgelm-tui ls`."""
    if command == "ls":
        return _Parser(prog="forgelm-tui ls", description="List the runs forgelm-tui knows: "
                       "live ones (the per-user registry) and those under ./forgelm-tui-runs.")
    if command == "serve":
        return _serve_parser()
    parser = _Parser(prog="forgelm-tui attach",
                     description="The TUI on a running run (started anywhere, --no-tui too): "
                                 "d detaches, the run goes on; q after its end quits with its "
                                 "code.")
    _run_arguments(parser, "watch only: cancel, kill and forward are refused")
    parser.add_argument("--via", choices=("terminal", "browser"), default="terminal",
                        help="how the operator reaches this viewer, recorded with each command "
                             "(forgelm-tui serve passes browser)")
    parser.add_argument("--nice", type=_viewer_nice, default=VIEWER_NICE, metavar="N",
                        help=f"the viewer's CPU niceness (default {VIEWER_NICE}: under "
                             "contention the ranks and the supervisor go first; 0 keeps it)")
    return parser


VIEWER_NICE = 10  # an attached viewer yields the CPU to the run it watches


def _viewer_nice(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--nice must be a whole number 0..19, got {text!r}") from None
    if not 0 <= value <= 19:
        raise UsageError(f"--nice must be a whole number 0..19, got {value}")
    return value


def _serve_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="forgelm-tui serve",
                     description="The attach viewer of a running run in a web browser "
                                 "(textual-serve), behind a random access token. Closing the "
                                 "tab detaches; the run goes on. Ctrl+C stops serving.")
    _run_arguments(parser, "the tabs watch only: cancel, kill and forward are refused")
    parser.add_argument("--port", type=lambda text: parse_port(text, "--port", 0), default=0,
                        metavar="P",
                        help="the port to listen on (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", metavar="H",
                        help="the address to listen on (default 127.0.0.1; any other than "
                             "loopback needs --allow-remote)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a non-loopback --host: anyone who can reach it and has "
                             "the URL (its token) can cancel the run")
    return parser


