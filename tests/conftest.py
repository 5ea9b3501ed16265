"""Shared helpers: run the real CLI in a subprocess, wait on conditions with deadlines."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Bytecode is cached, whatever the environment says: with PYTHONDONTWRITEBYTECODE set, every
# supervisor the suite starts compiled forgelm_tui again and every xdist worker rewrote every
# test module's asserts again (~20 s of CPU in all). Set here, before the workers start, so they
# and every process they start inherit it; a user's pip install compiles the package anyway.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# CPU_ACCOUNTING=<dir> pytest: a line per test of its wall and CPU (tests/cpu_accounting.py).
pytest_plugins = ["cpu_accounting"] if os.environ.get("CPU_ACCOUNTING") else []

if TYPE_CHECKING:
    from forgelm_tui.engine.records import RankRecord
    from forgelm_tui.plan.planner import Plan
    from forgelm_tui.verdict import RankEnding

RANKS = Path(__file__).parent / "ranks"

# Every run registers itself for `forgelm-tui attach` (SPEC §9): the tests' runs go to a registry
# of their own, never the user's (and a test's `attach` never finds another test's run there).
if "FORGELM_TUI_TEST_STATE" not in os.environ:
    import tempfile

    os.environ["FORGELM_TUI_TEST_STATE"] = os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(
        prefix="forgelm-tui-test-state-")


def wait_for(condition: Callable[[], Any], timeout: float, what: str, step: float = 0.02) -> Any:
    """Poll ``condition`` until it is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


@dataclass
class Run:
    proc: subprocess.Popen[str]
    run_dir: Path

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def envelope(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "envelope.json").read_text())

    def output(self) -> tuple[str, str]:
        out, err = self.proc.communicate(timeout=30)
        return out, err

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def dies_with_the_test() -> None:
    """preexec_fn of every supervisor a test starts: SIGKILL when the test's process dies (a
    pytest worker killed mid-test leaves no supervisor running; its guardian stops the ranks).
    Tests start supervisors from the main thread only: the signal follows the forking thread."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("FORCE_COLOR", None)
    env["CI"] = "true"
    env.update(extra or {})
    return env


def start(
    args: Sequence[str],
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    stdout: int | None = subprocess.PIPE,
) -> Run:
    """Start ``forgelm-tui --no-tui --run-dir tmp/run ARGS`` with the test's interpreter."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir", str(run_dir), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=cli_env(env),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=dies_with_the_test,
    )
    return Run(proc, run_dir)


def run_cli(args: Sequence[str], tmp_path: Path, timeout: float = 60, **kw: Any) -> Run:
    run = start(args, tmp_path, **kw)
    run.wait(timeout)
    return run


def rank_script(name: str) -> str:
    return str(RANKS / name)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


# ------------------------------------------------------- in-process plans, records, clocks


class FakeClock:
    """Seconds under the test's hand: pass it where the code takes a ``clock`` (or ``wall``)."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_plan(tmp_path: Path, argv: Sequence[str], world: int, *, run_id: str = "test",
              grace: float = 5.0, **spec: Any) -> Plan:
    """The plan of an in-process ``Session``: ``argv`` on ``world`` ranks of one node, files in
    ``tmp_path/run`` (made here), an envelope there; ``spec``: other LaunchSpec fields."""
    from forgelm_tui.engine.spec import LaunchSpec
    from forgelm_tui.plan.planner import Plan, RunInfo
    from forgelm_tui.verdict import Contract

    run_spec = LaunchSpec(argv=tuple(argv), run_id=run_id, run_dir=tmp_path / "run",
                          nproc_per_node=world, master_addr="127.0.0.1", master_port=29999,
                          grace=grace, cwd=tmp_path, **spec)
    run_spec.run_dir.mkdir()
    info = RunInfo(run_id=run_id, command=["forgelm-tui", *argv], mode="script",
                   contract=Contract.FORGELM, spec=run_spec)
    return Plan(spec=run_spec, info=info, envelope_paths=[run_spec.run_dir / "envelope.json"])


def rk(rank: int, code: int | None = None, sig: int | None = None, t: float = 1.0,
       signalled: bool = False, *, outside: bool = False, forwarded: bool = False,
       crash: tuple[str, str] | None = None, node: int = 0) -> RankEnding:
    """A rank's ending, as the verdict tables write it: exit ``code`` or death by ``sig`` at
    monotonic ``t``; ``signalled`` by the supervisor first, an ``outside`` stop signal,
    ``forwarded`` death, an uncaught ``crash`` (type, message), on machine ``node``."""
    from forgelm_tui.verdict import RankEnding

    return RankEnding(rank, code, sig, t, signalled, outside, forwarded_death=forwarded,
                      crash=crash, node_rank=node)



def rank_record(rank: int, run_dir: str | Path = "/runs/x", **fields: Any) -> RankRecord:
    """The engine's record of rank ``rank`` (local rank the same, node 0), its files named as
    the engine names them in ``run_dir``; ``fields``: the record's other fields."""
    from forgelm_tui.engine.records import RankRecord

    return RankRecord(rank, rank, 0, f"{run_dir}/rank-{rank}.stdout.log",
                      f"{run_dir}/rank-{rank}.stderr.log", f"{run_dir}/rank-{rank}.error.json",
                      **fields)


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    return path


def ready_pids(marks: Path, ranks: int) -> list[int]:
    """Wait until every rank wrote its ready file; return every pid they reported."""

    def all_ready() -> list[int] | None:
        files = [marks / f"ready-{r}" for r in range(ranks)]
        if not all(f.exists() for f in files):
            return None
        return [int(p) for f in files for p in f.read_text().split()]

    return list(wait_for(all_ready, 30, f"{ranks} ranks to be ready"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight model (tests/forgelm_job.py), built once per test session: in the
    base temp dir every xdist worker shares, under a lock, so the second worker reuses it."""
    import fcntl

    from forgelm_job import build_tiny_model

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # pytest-<n>/, the parent of every worker's own base
    with open(shared / "tiny-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_tiny_model(shared / "tiny-model")


@pytest.fixture
def term(tmp_path: Path) -> Iterator[Any]:
    """A tmux terminal (tests/tmux_terminal.py); whatever it started is reaped after the test."""
    from tmux_terminal import Terminal

    terminal = Terminal(tmp_path)
    try:
        yield terminal
    finally:
        terminal.close()
        terminal.reap()


def pytest_configure(config: pytest.Config) -> None:
    """Mark everything this process starts so that it dies with it (tests/worker_watchdog.py),
    then start ruff and mypy in the session's main process when test_lint will run (the whole
    suite, or test_lint named): they overlap the tests that wait on rank processes."""
    from worker_watchdog import start_watchdog

    start_watchdog()
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller started them, the environment says where
    named = [str(arg) for arg in config.args]
    if not named or any(arg.rstrip("/") in ("tests", ".") or "test_lint" in arg
                        for arg in named):
        from lint_jobs import start_lint_jobs

        start_lint_jobs()


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The session's order, the same in every xdist worker (a stable sort of what each
    collected). Each file goes to one worker (``--dist loadfile --no-loadscope-reorder``), in
    this order:

    - the real-SLURM tests first: their jobs, submitted together, then run while the rest of
      the suite does (tests/slurm_jobs.py);
    - without them, the files that take longest first (file_costs.json), so the session ends on
      short files with every worker busy until then;
    - with them, the shortest first: for about 90 s the SLURM jobs' ranks (both test nodes
      live on this machine's 2 cores) keep 20-50 processes runnable, and a real-process test
      started then, a multi-node or tmux one, starves past its deadlines (seen in CI:
      45-90 s without a demo's first step); the in-process files fill that time instead.
      Even those can be starved 30x in that window (a 1 s structure test and a 1 s import
      probe ran past their 30 s timeouts in two CI runs): with the SLURM tests, a test's own
      timeout below STORM_TIMEOUT is raised to it (a hang still ends at 120 s, the default).
    """
    from cpu_accounting import FILE_COST_DEFAULT, file_costs

    costs = file_costs()
    slurm = any(item.get_closest_marker("slurm") for item in items)
    sign = 1 if slurm else -1

    def order(item: pytest.Item) -> tuple[bool, float]:
        cost = costs.get(item.nodeid.split("::")[0], FILE_COST_DEFAULT)
        return item.get_closest_marker("slurm") is None, sign * cost

    items.sort(key=order)
    global _SLURM_IN_SESSION
    _SLURM_IN_SESSION = slurm
    if slurm:
        for item in items:
            marker = item.get_closest_marker("timeout")
            if marker is not None and marker.args and marker.args[0] < STORM_TIMEOUT:
                item.add_marker(pytest.mark.timeout(STORM_TIMEOUT), append=False)


STORM_TIMEOUT = 120.0  # a test's timeout while the SLURM jobs start (pyproject's default)
STORM_WAIT = 150.0  # at most this long, a worker's first test waits for the jobs' start
STORM_RUNNING = 5  # ...until at most this many processes are runnable (3 readings in a row)
_SLURM_IN_SESSION = False
_storm_waited = False


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With the SLURM tests in the session, each worker's first other test waits until the
    SLURM jobs' start is over: their ~54 processes importing torch on 2 cores starved 1 s tests
    past 20-30 s deadlines (three CI runs, session 12). Runnable processes are read from
    /proc/loadavg; the wait ends at STORM_WAIT whatever they are. It waits outside the test's
    timeout (this wrapper runs before pytest-timeout's starts the timer): waiting inside it, a
    busier CI machine timed the first test out in its setup (stop 33)."""
    _wait_for_the_storm(item)
    yield


def _wait_for_the_storm(item: pytest.Item) -> None:
    global _storm_waited
    if _storm_waited or not _SLURM_IN_SESSION or item.get_closest_marker("slurm"):
        return
    _storm_waited = True
    deadline, calm = time.monotonic() + STORM_WAIT, 0
    while calm < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        calm = calm + 1 if running <= STORM_RUNNING else 0


__all__ = ["RANKS", "FakeClock", "Run", "make_plan", "pid_alive", "rank_record", "rank_script",
           "ready_pids", "rk", "run_cli", "signal", "start", "wait_for"]
