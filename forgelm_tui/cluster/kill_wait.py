"""The stop's grace, fitted to the scheduler's own SIGTERM -> SIGKILL window (issue 20).

SLURM sends every process of a step SIGTERM and, ``KillWait`` seconds later (30 by default),
SIGKILL. A supervisor whose grace is as long as that window is killed with its ranks before it
writes the envelope. So under SLURM, unless ``--grace`` says otherwise, the grace is the window
less a margin for the supervisor's own end (the envelope written, the process gone): ``KillWait
- 5 s``, at least 1 s. The window comes from ``--kill-wait S``, else ``FORGELM_TUI_KILL_WAIT``,
else (inside a SLURM job) ``scontrol show config``'s ``KillWait``. An explicit ``--grace`` longer
than the window allows gets a warning naming it, and is kept: the operator may know better
(preemption's window is ``GraceTime + KillWait``, longer than ``KillWait`` alone).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

DEFAULT_GRACE = 30.0
MARGIN = 5.0  # the supervisor's own end after the grace: envelope, exit
MIN_GRACE = 1.0
KILL_WAIT_ENV = "FORGELM_TUI_KILL_WAIT"
_KILL_WAIT = re.compile(r"^\s*KillWait\s*=\s*(\d+)\s*sec", re.MULTILINE)
_PROCTRACK = re.compile(r"^\s*ProctrackType\s*=\s*(\S+)", re.MULTILINE)


class KillWaitError(Exception):
    """The window given cannot be used (one line for the operator)."""


@dataclass(frozen=True)
class GraceChoice:
    grace: float
    source: str  # what set it: "--grace", "default", or the window's source
    window: float | None  # the scheduler's SIGTERM -> SIGKILL window, where known
    window_source: str | None  # "--kill-wait", "FORGELM_TUI_KILL_WAIT", "SLURM KillWait"
    warning: str | None  # one line for the operator, or None


@functools.cache
def scontrol_config(timeout: float = 10.0) -> str | None:
    """``scontrol show config``, once per process; None if it cannot be read."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        done = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def scontrol_kill_wait() -> float | None:
    """SLURM's KillWait in seconds from ``scontrol show config``; None if it cannot be read."""
    config = scontrol_config()
    return None if config is None else parse_kill_wait(config)


def scheduler_reaches_ranks(env: Mapping[str, str],
                            read_config: Callable[[], str | None] = scontrol_config) -> bool:
    """Whether SLURM's own signals (scancel, a time limit, ``--signal``) reach the ranks as
    well as forgelm-tui: with ``ProctrackType=proctrack/linuxproc`` slurmstepd signals every
    process of the step; with ``proctrack/cgroup`` (most clusters) only the task, forgelm-tui
    (measured on SLURM 22.05: docs/schedulers.md). Outside a SLURM job: no."""
    if not env.get("SLURM_JOB_ID"):
        return False
    config = read_config()
    found = _PROCTRACK.search(config or "")
    return found is not None and found.group(1) == "proctrack/linuxproc"


def parse_kill_wait(config: str) -> float | None:
    found = _KILL_WAIT.search(config)
    return float(found.group(1)) if found else None


def _window(option: float | None, env: Mapping[str, str],
            read_slurm: Callable[[], float | None]) -> tuple[float | None, str | None]:
    if option is not None:
        return option, "--kill-wait"
    raw = env.get(KILL_WAIT_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise KillWaitError(f"{KILL_WAIT_ENV}={raw!r}: not a number of seconds") from None
        return value, KILL_WAIT_ENV
    if env.get("SLURM_JOB_ID"):
        kill_wait = read_slurm()
        if kill_wait is not None:
            return kill_wait, "SLURM KillWait"
    return None, None


def choose_grace(explicit: float | None, kill_wait: float | None, env: Mapping[str, str],
                 read_slurm: Callable[[], float | None] = scontrol_kill_wait) -> GraceChoice:
    """The grace in force and why; ``explicit`` is ``--grace`` (None: not given)."""
    window, source = _window(kill_wait, env, read_slurm)
    if window is not None and window <= 0:
        raise KillWaitError(f"{source} {window:g}: the window must be more than 0 seconds")
    fits = None if window is None else max(MIN_GRACE, window - MARGIN)
    if explicit is not None:
        warning = None
        if fits is not None and explicit > fits:
            warning = (f"--grace {explicit:g} s is longer than the scheduler allows ({source} "
                       f"{window:g} s, less {MARGIN:g} s for forgelm-tui's own end): the "
                       f"scheduler may SIGKILL it before the envelope is written; "
                       f"--grace {fits:g} fits")
        return GraceChoice(explicit, "--grace", window, source, warning)
    if fits is None:
        return GraceChoice(DEFAULT_GRACE, "default", None, None, None)
    return GraceChoice(fits, source or "default", window, source, None)
