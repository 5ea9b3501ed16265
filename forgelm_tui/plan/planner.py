"""From the operator's argv to a checked plan; every check happens before any rank starts."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from forgelm_tui.cluster.config import ClusterConfig, cluster_config
from forgelm_tui.cluster.kill_wait import (
    GraceChoice,
    KillWaitError,
    choose_grace,
    scheduler_reaches_ranks,
)
from forgelm_tui.engine.spec import LaunchSpec
from forgelm_tui.plan import pet, prefix
from forgelm_tui.plan.forgelm import JobConfigError, find_config_arg, read_job_config
from forgelm_tui.plan.options import (
    DEFAULT_RUN_ROOT,
    DEMO_MODULE,
    FORGELM_MODULES,
    Target,
    UsageError,
    build_parser,
    check_port,
    parse_count,
    parse_local_ranks,
    parse_restarts,
    parse_signals,
    split_argv,
)
from forgelm_tui.plan.requeue import requeue_count, requeue_dir, requeues_entry
from forgelm_tui.plan.translated import Translated
from forgelm_tui.private_files import make_private_dir
from forgelm_tui.rank.collectives import COLLECTIVES_ENV
from forgelm_tui.verdict import Contract


@dataclass
class RunInfo:
    """The run-level facts the envelope needs, whether or not any rank ever started."""

    run_id: str
    command: Sequence[str]  # forgelm-tui's own command line
    mode: str  # forgelm | script | module | program | demo | unknown
    contract: Contract
    # The launch, once planned (a multi-node join replaces it): the envelope reads the ranks'
    # command, world size, rendezvous, drain and stall timeout there, never from a copy.
    spec: LaunchSpec | None = None
    # What the planner knew before the launch was planned (an envelope of bad input says it).
    nnodes: int = 1
    node_rank: int = 0
    run_dir: str | None = None
    grace: float | None = None
    grace_source: str | None = None  # --grace, default, or the scheduler window's source
    kill_window: float | None = None  # the scheduler's SIGTERM -> SIGKILL window, where known
    graceful: bool = False
    collective_trace: bool = False  # Python ranks send their collective counts (docs/progress.md)
    max_restarts: int = 0
    restart_backoff: float = 1.0
    requeues: dict[str, Any] | None = None  # a requeued SLURM job's earlier runs (requeue.py)
    job_config: str | None = None
    launcher: str | None = None  # the launcher's command forgelm-tui stands in for (prefix.py)
    last_exit_path: str | None = None
    envelope_paths: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """What the CLI decided: the launch spec plus how to report the run."""

    spec: LaunchSpec
    info: RunInfo
    contract: Contract = Contract.FORGELM
    output_format: str = "text"  # text | json
    view: str = "headless"  # headless | tui
    envelope_paths: list[Path] = field(default_factory=list)
    forgelm_mode: bool = False
    cluster: ClusterConfig | None = None  # multi-node (SPEC §8); None on one node
    cluster_root: Path | None = None  # --run-dir of a multi-node run: node-<i> goes inside
    warnings: list[str] = field(default_factory=list)  # one line each, printed before launch
    output_ranks: frozenset[int] | None = None  # --local-ranks-filter (headless/view.py)


class Planner:
    """Collects what is known as parsing proceeds, so a pre-launch error still has a home."""

    def __init__(self, args: list[str], run_id: str) -> None:
        self.args = args
        self.run_id = run_id
        self.requeued = 0  # the run dir is requeue-N inside the one it had (plan/requeue.py)
        self.cwd = Path.cwd()
        self.info = RunInfo(run_id=run_id, command=["forgelm-tui", *args], mode="unknown",
                            contract=Contract.FORGELM)
        self.ns: argparse.Namespace | None = None
        self.run_dir: Path | None = None
        self.extra_paths: list[Path] = []
        self.output_format = "text"
        self.from_env = pet.FromEnv({})
        self.launcher = Translated("torchrun", [])  # the launcher's word, if any (prefix.py)
        self.tail = 0  # the rank argv's words after the script: the program's own arguments

    # ------------------------------------------------------------- the happy path

    def plan(self) -> Plan:
        """The checked plan; a refusal of a value from a ``PET_`` variable names it."""
        try:
            return self._plan()
        except UsageError as exc:
            raise UsageError(self.from_env.explain(str(exc))) from None

    def _plan(self) -> Plan:
        parser = build_parser()
        options, target = split_argv(self.args, parser)
        options, target = self._launcher(options, target, parser)
        if target.mode == "demo":
            parser = build_parser(demo=True)
            options = options + target.args[1:]
        self._lenient(options)
        ns = parser.parse_args(options)
        if self.launcher.launcher != "deepspeed":  # torchrun's PET_<DEST>; not deepspeed's
            self.from_env = pet.apply(ns, options, parser, os.environ)
        self.ns = ns
        self._where(ns)
        self._check_options(ns)
        grace = self._grace(ns)
        default_nproc = 2 if target.mode == "demo" else 1
        nproc = parse_count(ns.nproc_per_node, "--nproc-per-node", default_nproc)
        cluster = cluster_config(ns, nproc, self.run_id, os.environ)
        if cluster is not None:
            self._multi_node(ns, cluster)
        argv = self._rank_argv(ns, target)
        graceful = ns.graceful if ns.graceful is not None else self.info.mode == "forgelm"
        if graceful:
            argv = self._graceful(argv)
        elif ns.collective_trace == "on" and self.info.mode not in ("program", "demo"):
            argv = [*argv[:2], "-m", "forgelm_tui.rank.observed", *argv[2:]]  # the demo: itself
        self.info.graceful = graceful
        self.info.collective_trace = ns.collective_trace == "on" and self.info.mode != "program"
        master_addr, port = self._rendezvous(ns, cluster)
        assert self.run_dir is not None  # _where
        launcher = self.launcher
        spec = LaunchSpec(
            argv=tuple(argv),
            run_id=self.run_id,
            run_dir=self.run_dir,
            nproc_per_node=nproc,
            master_addr=master_addr,
            master_port=port,
            nnodes=cluster.nnodes if cluster else 1,
            node_rank=(cluster.node_rank or 0) if cluster else 0,
            grace=grace.grace,
            drain=ns.drain,
            stall_timeout=ns.stall_timeout,
            forward_signals=parse_signals(ns.forward_signals),
            scheduler_reaches_ranks=scheduler_reaches_ranks(os.environ),
            cwd=self.cwd, max_restarts=self.info.max_restarts, role=ns.role,
            extra_env={**launcher.env,
                       **(collective_env() if self.info.collective_trace else {})},
            env_style=launcher.env_style, local_rank_at=self._local_rank_at(argv),
        )
        info = self.info
        info.spec, info.run_dir, info.grace = spec, str(self.run_dir), grace.grace
        return Plan(
            spec=spec, info=info, contract=info.contract, output_format=ns.output_format,
            view=self._view(ns),
            envelope_paths=self.envelope_paths(),
            forgelm_mode=info.mode == "forgelm",
            cluster=cluster,
            cluster_root=ns.run_dir.absolute() if cluster and ns.run_dir else None,
            warnings=[*launcher.notices, *([grace.warning] if grace.warning else [])],
            output_ranks=parse_local_ranks(ns.local_ranks_filter, nproc),
        )

    def _launcher(self, options: list[str], target: Target,
                  parser: argparse.ArgumentParser) -> tuple[list[str], Target]:
        """forgelm-tui torchrun ...: torchrun's options are forgelm-tui's (plan/prefix.py)."""
        try:
            launched = prefix.unwrap(options, target.args, _no_python(options), parser)
        except UsageError:
            with contextlib.suppress(UsageError):  # the refusal's envelope where it was asked
                self._where(parser.parse_args(options))
            raise
        if launched is None:
            return options, target
        self.launcher, self.info.launcher = launched, launched.launcher
        return split_argv(launched.words, parser)

    def _local_rank_at(self, argv: Sequence[str]) -> int | None:
        """Where deepspeed's ``--local_rank=N`` goes: after the script, before its arguments
        (ForgeLM's and the demo's parsers refuse it: withheld, with a line, docs/launchers.md)."""
        if not self.launcher.local_rank_arg:
            return None
        if self.info.mode in ("forgelm", "demo"):
            self.launcher.notices.append(
                f"{self.launcher.launcher}: --local_rank=N is not passed to "
                f"{'ForgeLM' if self.info.mode == 'forgelm' else 'the demo'} (its command line "
                "refuses it; it reads LOCAL_RANK), as with --no_local_rank")
            return None
        return len(argv) - self.tail

    def _where(self, ns: argparse.Namespace) -> None:
        """Where the run's envelope goes and how it is printed, once its options parsed."""
        self.output_format = ns.output_format
        self.info.contract = Contract(ns.exit_contract)
        if ns.run_dir is None:  # a new run id each time: a requeue's dir is new already
            self.run_dir = (Path(DEFAULT_RUN_ROOT) / self.run_id).absolute()
        else:
            self.run_dir = self._requeued(ns.run_dir.absolute())
        if ns.envelope is not None:
            self.extra_paths = [ns.envelope.absolute()]

    def _grace(self, ns: argparse.Namespace) -> GraceChoice:
        """The stop's grace: --grace, else fitted to the scheduler's kill window where one is
        known (cluster/kill_wait.py), else 30 s."""
        if ns.kill_wait is not None and ns.kill_wait <= 0:
            raise UsageError("--kill-wait must be more than 0 seconds")
        try:
            choice = choose_grace(ns.grace, ns.kill_wait, os.environ)
        except KillWaitError as exc:
            raise UsageError(str(exc)) from None
        self.info.grace, self.info.grace_source = choice.grace, choice.source
        self.info.kill_window = choice.window
        return choice

    def _rendezvous(self, ns: argparse.Namespace,
                    cluster: ClusterConfig | None) -> tuple[str, int]:
        """MASTER_ADDR and MASTER_PORT for the ranks (checked where rank 0 will listen), and
        the run dir made on one node (a multi-node one is made after the join)."""
        if cluster is None:
            master_addr = ns.master_addr or "127.0.0.1"
            port = check_port(master_addr, ns.master_port)
            assert self.run_dir is not None
            try:
                make_private_dir(self.run_dir)  # 0700, whatever the umask (docs/security.md)
            except OSError as exc:
                raise UsageError(f"--run-dir {self.run_dir}: cannot create ({exc.strerror})") \
                    from None
            if not os.access(self.run_dir, os.W_OK | os.X_OK):  # read-only, not ours
                raise UsageError(f"--run-dir {self.run_dir}: not writable")
            return master_addr, port
        if cluster.node_rank == 0 and cluster.master_port:  # rank 0 listens on node 0
            check_port("127.0.0.1", str(cluster.master_port))
        return cluster.master_addr, cluster.master_port or 0

    def _multi_node(self, ns: argparse.Namespace, cluster: ClusterConfig) -> None:
        """Run id and run dir as far as they are known before the join (node 0's id is
        adopted at the join unless --rdzv-id or SLURM fixed it)."""
        if cluster.run_id_fixed:
            self.run_id = self.info.run_id = cluster.run_id
        root = ns.run_dir or Path(DEFAULT_RUN_ROOT) / self.run_id
        node = "x" if cluster.node_rank is None else cluster.node_rank
        self.run_dir = self._requeued((root / f"node-{node}").absolute())
        self.info.nnodes = cluster.nnodes
        self.info.node_rank = cluster.node_rank or 0

    def _check_options(self, ns: argparse.Namespace) -> None:
        self.info.max_restarts = parse_restarts(ns.max_restarts)
        self.info.restart_backoff = ns.restart_backoff
        for name in ("grace", "drain", "stall_timeout", "restart_backoff"):
            value = getattr(ns, name)
            if value is not None and value < 0:
                raise UsageError(f"--{name.replace('_', '-')} must not be negative")
        if ns.stall_timeout == 0:
            raise UsageError("--stall-timeout must be more than 0 seconds")

    def _rank_argv(self, ns: argparse.Namespace, target: Target) -> list[str]:
        python = [sys.executable, "-u"]  # -u as torchrun: no output lost in a buffer
        if target.mode == "none":
            raise UsageError("nothing to run: give a script, -m module, --no-python program, "
                             "--config job.yaml or demo (see --help)")
        if target.mode == "demo":
            from forgelm_tui.demo.options import demo_argv

            self.info.mode = "demo"
            return [*python, "-m", DEMO_MODULE, *demo_argv(ns)]
        if target.mode == "forgelm":
            return self._forgelm_argv(target.args[1:])
        head, rest = target.args[0], target.args[1:]
        if ns.module and ns.no_python:
            raise UsageError("-m and --no-python cannot be used together")
        if ns.module:
            if head in FORGELM_MODULES:
                return self._forgelm_argv(rest)
            top = head.split(".", 1)[0]
            if not top or (importlib.util.find_spec(top) is None and  # python -m: cwd too
                           PathFinder.find_spec(top, [str(self.cwd)]) is None):
                raise UsageError(f"-m {head}: no module named {top!r} in {sys.executable}")
            self.info.mode, self.tail = "module", len(rest)
            return [*python, "-m", head, *rest]
        if ns.no_python:
            if shutil.which(head) is None:
                raise UsageError(f"--no-python {head}: no such program (not on PATH or not "
                                 "executable)")
            self.info.mode, self.tail = "program", len(rest)
            return [head, *rest]
        if head in FORGELM_MODULES and not Path(head).exists():
            return self._forgelm_argv(rest)
        if not Path(head).is_file():
            raise UsageError(f"{head}: no such script")
        if not os.access(head, os.R_OK):
            raise UsageError(f"{head}: permission denied")
        self.info.mode, self.tail = "script", len(rest)
        return [*python, head, *rest]

    def _graceful(self, argv: list[str]) -> list[str]:
        """``python -u X`` -> ``python -u -m forgelm_tui.rank.graceful X``."""
        if self.info.mode == "program":
            raise UsageError("--graceful works for Python ranks only, not with --no-python")
        return [*argv[:2], "-m", "forgelm_tui.rank.graceful", *argv[2:]]

    def _forgelm_argv(self, forgelm_args: list[str]) -> list[str]:
        self.info.mode = "forgelm"
        config = find_config_arg(forgelm_args)
        if config is None:
            raise UsageError("ForgeLM mode needs --config job.yaml")
        try:
            job = read_job_config(config, self.cwd)
        except JobConfigError as exc:
            raise UsageError(str(exc)) from None
        self.info.job_config = str(job.path)
        last_exit = job.output_dir / "last_exit.json"
        self.info.last_exit_path = str(last_exit)
        self.extra_paths.append(last_exit)
        if importlib.util.find_spec("forgelm") is None:
            raise UsageError(f"ForgeLM is not installed for {sys.executable}: pip install forgelm")
        if not any(a == "--output-format" or a.startswith("--output-format=")
                   for a in forgelm_args):
            # ForgeLM's JSON result is what the envelope carries; ask for it unless the
            # operator chose a format.
            forgelm_args = [*forgelm_args, "--output-format", "json"]
        return [sys.executable, "-u", "-m", "forgelm.cli", *forgelm_args]

    def _view(self, ns: argparse.Namespace) -> str:
        wanted = ns.tui
        if wanted is None:
            wanted = (
                sys.stdout.isatty() and not os.environ.get("CI") and ns.output_format == "text"
            )
        if wanted and importlib.util.find_spec("forgelm_tui.tui") is not None:
            return "tui"
        return "headless"

    # ------------------------------------------------------------- pre-launch errors

    def _lenient(self, options: list[str]) -> None:
        """Pick up --run-dir, --envelope and --output-format even if the rest is bad."""
        for index, token in enumerate(options):
            name, eq, value = token.partition("=")
            if not eq:
                value = options[index + 1] if index + 1 < len(options) else ""
            if not value:
                continue
            if name == "--run-dir":
                self.run_dir = self._requeued(Path(value).absolute())
            elif name == "--envelope":
                self.extra_paths = [Path(value).absolute()]
            elif name == "--output-format" and value in ("text", "json"):
                self.output_format = value

    def _requeued(self, run_dir: Path) -> Path:
        """A requeued SLURM job's run dir: ``requeue-N`` inside the one it had (requeue.py)."""
        self.requeued = requeue_count(os.environ)
        return requeue_dir(run_dir, self.requeued)

    def envelope_paths(self) -> list[Path]:
        run_dir = self.run_dir or (Path(DEFAULT_RUN_ROOT) / self.run_id).absolute()
        self.info.run_dir = str(run_dir)
        if self.requeued:
            self.info.requeues = requeues_entry(run_dir.parent, self.requeued)
        paths = [run_dir / "envelope.json"]
        for path in self.extra_paths:  # --envelope is seen twice (lenient pass, argparse)
            if path not in paths:
                paths.append(path)
        return paths


def collective_env() -> dict[str, str]:
    """What asks a rank's runner to send its collective counts (rank/collectives.py)."""
    return {COLLECTIVES_ENV: "1"}


def _no_python(options: Sequence[str]) -> bool:
    """--no-python among forgelm-tui's options, or torchrun's PET_NO_PYTHON (plan/pet.py)."""
    if any(o in ("--no-python", "--no_python") for o in options):
        return True
    value = os.environ.get("PET_NO_PYTHON", "0").strip()
    return value.lstrip("-").isdigit() and int(value) != 0
