"""Why the scheduler stopped the job: ``stop.scheduler = {"kind", "evidence"}`` (issue 20).

Asked once, when a stop from a signal to the supervisor begins inside a SLURM job
(``SLURM_JOB_ID``): ``scontrol show job -o <id>`` gives the job's state as slurmctld sees it
then. The kind:

| kind | evidence |
|---|---|
| ``time_limit`` | JobState ``TIMEOUT``, or start + ``TimeLimit`` (``SLURM_JOB_END_TIME``) reached |
| ``scancel`` | JobState ``CANCELLED`` (accounting's, while slurmctld says COMPLETING) |
| ``preempted`` | JobState ``PREEMPTED``, or ``PreemptTime`` set (during ``GraceTime``) |
| ``node_failure`` | JobState ``NODE_FAIL`` |
| ``unknown`` | none of these (a signal from elsewhere, or scontrol could not answer) |

The evidence keeps what was read (state, reason, end time, the signal's sender) so a reader can
check the call. Nothing here waits for long: scontrol gets a few seconds, and the envelope is
written without the answer if none came.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from forgelm_tui.cluster.kill_wait import MARGIN, MIN_GRACE
from forgelm_tui.engine import events as ev
from forgelm_tui.engine.records import CancelSource

if TYPE_CHECKING:
    from forgelm_tui.engine.supervisor import Supervisor

SCONTROL_WAIT = 1.5  # seconds a client call may take: the envelope must be on disk well before
# the scheduler's SIGKILL, and the calls are made while the ranks stop
_STATES = {"TIMEOUT": "time_limit", "CANCELLED": "scancel", "PREEMPTED": "preempted",
           "NODE_FAIL": "node_failure", "DEADLINE": "time_limit"}
END_MARGIN = 2.0  # a signal this close to the job's end time is its time limit


def parse_job(text: str) -> dict[str, str]:
    """``scontrol show job -o``'s one line of ``Key=Value`` pairs (values without spaces; the
    few that may have them, like Command, are not read)."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def _epoch(value: str | None) -> float | None:
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    with contextlib.suppress(ValueError):
        return float(value)
    try:
        return datetime.fromisoformat(value).timestamp()  # scontrol's local time
    except ValueError:
        return None


def limit_seconds(value: str | None) -> float | None:
    """SLURM's time format (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in seconds;
    None for ``UNLIMITED`` and anything else."""
    if not value:
        return None
    days, _, clock = value.rpartition("-") if "-" in value else ("0", "", value)
    try:
        parts = [int(p) for p in clock.split(":")]
        day = int(days or 0)
    except ValueError:
        return None
    if "-" in value:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = 0, parts[0], 0
    return float(((day * 24 + hours) * 60 + minutes) * 60 + seconds)


def limit_end(env: Mapping[str, str], job: Mapping[str, str] | None) -> float | None:
    """When the job's time limit falls: its start plus its limit (scontrol), else the end time
    SLURM gave the job at its start (``SLURM_JOB_END_TIME``). Not ``EndTime``: a cancelled
    job's is the moment of the cancel."""
    start = _epoch((job or {}).get("StartTime"))
    limit = limit_seconds((job or {}).get("TimeLimit"))
    if start is not None and limit is not None:
        return start + limit
    return _epoch(env.get("SLURM_JOB_END_TIME"))


def classify(env: Mapping[str, str], job: Mapping[str, str] | None, sender: dict[str, Any] | None,
             at: float, accounted: str | None = None) -> dict[str, Any]:
    """The scheduler's reason for the stop that began at ``at`` (epoch seconds). ``accounted``:
    the job's state in accounting (``sacct``), which names the cause while slurmctld's own
    still says COMPLETING."""
    state = (job or {}).get("JobState")
    end = limit_end(env, job)
    evidence: dict[str, Any] = {
        "job_id": env.get("SLURM_JOB_ID"), "job_state": state, "accounted_state": accounted,
        "reason": (job or {}).get("Reason"), "time_limit_at": end,
        "scontrol": job is not None, "sender": sender}
    preempt = _epoch((job or {}).get("PreemptTime"))
    evidence["preempt_time"] = preempt
    named = [_STATES.get((s or "").split(" ")[0]) for s in (state, accounted)]
    kind = next((k for k in named if k), None)
    if kind is None and preempt is not None and at >= preempt - END_MARGIN:
        kind = "preempted"  # in its GraceTime: still RUNNING, PreemptTime set
    if kind is None and end is not None and at >= end - END_MARGIN:
        kind = "time_limit"
    return {"kind": kind or "unknown", "evidence": evidence}


async def _run(argv: list[str], wait: float) -> str | None:
    """A client command's output, or None (missing, failed, or no answer within ``wait``)."""
    path = shutil.which(argv[0])
    if path is None:
        return None
    try:
        proc = await asyncio.create_subprocess_exec(
            path, *argv[1:], stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), wait)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return None
    except asyncio.CancelledError:  # the answer is no longer waited for: no client left behind
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    return out.decode("utf-8", "replace") if proc.returncode == 0 else None


async def scheduler_stop(env: Mapping[str, str], sender: dict[str, Any] | None,
                         at: float | None = None) -> dict[str, Any] | None:
    """The stop's scheduler cause inside a SLURM job; None outside one. slurmctld's state
    first; while it says only COMPLETING or RUNNING, accounting's (``sacct``), which has the
    cause at once when the cluster keeps accounting."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    at = time.time() if at is None else at
    text = await _run(["scontrol", "show", "job", "-o", job_id], SCONTROL_WAIT)
    job = None if text is None else parse_job(text)
    accounted = None
    if (job or {}).get("JobState") not in _STATES:
        rows = await _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"],
                          SCONTROL_WAIT)
        accounted = (rows or "").strip().splitlines()[0] if (rows or "").strip() else None
    cause = classify(env, job, sender, at, accounted)
    if cause["kind"] == "preempted":
        cause["evidence"].update(await preemption_grace_time(env, job))
    return cause


async def preemption_grace_time(env: Mapping[str, str],
                                job: Mapping[str, str] | None) -> dict[str, Any]:
    """The GraceTime slurmctld gives a preempted job, where it takes it from: the job's QOS
    under ``PreemptType=preempt/qos`` (``sacctmgr show qos``), else its partition's
    (``preempt/partition_prio``, and whenever the type is not known): slurmctld's preempt
    plugins, ``_get_grace_time``. ``grace_time`` None when it could not be read."""
    partition = (job or {}).get("Partition") or env.get("SLURM_JOB_PARTITION")
    qos = (job or {}).get("QOS")
    config, part, qos_text = await asyncio.gather(  # at once: one call's time, not three
        _run(["scontrol", "show", "config"], SCONTROL_WAIT),
        _run(["scontrol", "show", "partition", "-o", partition], SCONTROL_WAIT)
        if partition else _none(),
        _run(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=GraceTime"], SCONTROL_WAIT)
        if qos else _none())
    preempt_type = config_value(config, "PreemptType")
    if preempt_type == "preempt/qos":
        return {"preempt_type": preempt_type, "grace_time_of": qos and f"QOS {qos}",
                "grace_time": qos_grace_time(qos_text)}
    return {"preempt_type": preempt_type, "grace_time_of": partition and f"partition {partition}",
            "grace_time": grace_time(part)}


async def _none() -> None:
    return None


def config_value(config: str | None, key: str) -> str | None:
    """One setting of ``scontrol show config`` (``Key = value`` lines)."""
    for line in (config or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip() or None
    return None


def grace_time(partition: str | None) -> float | None:
    """A partition's ``GraceTime`` (seconds) from ``scontrol show partition -o``; None if
    unknown."""
    value = parse_job(partition or "").get("GraceTime")
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def qos_grace_time(text: str | None) -> float | None:
    """A QOS's ``GraceTime`` from ``sacctmgr -n -P show qos NAME format=GraceTime``: SLURM's
    time (``00:00:05``, ``1-00:00:00``); None if unknown (no such QOS, no accounting)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if len(lines) != 1 or ":" not in lines[0]:
        return None
    return limit_seconds(lines[0])


def preemption_grace(cause: Mapping[str, Any] | None, window: float | None,
                     grace_source: str | None) -> tuple[float, str] | None:
    """The grace a preemption allows, and why; None where the grace stays: another cause, an
    explicit ``--grace``, no window or no GraceTime known."""
    if cause is None or cause.get("kind") != "preempted" or window is None:
        return None
    if grace_source in (None, "--grace", "default"):
        return None
    grace_time = cause.get("evidence", {}).get("grace_time")
    if not grace_time:
        return None
    grace = max(MIN_GRACE, grace_time + window - MARGIN)
    return grace, (f"preempted: GraceTime {grace_time:g} s + {grace_source} {window:g} s, "
                   f"less {MARGIN:g} s")


class SchedulerCause:
    """A listener: when a stop from a signal to the supervisor begins inside a SLURM job (its
    own, or another node's record of one), asks slurmctld why, once, in the background;
    :meth:`settle` gives the answer for the envelope.

    A preemption leaves more time than a time limit or scancel: SIGKILL comes ``GraceTime +
    KillWait`` after the notice, not ``KillWait``. Unless ``--grace`` was given, the grace
    derived from the window (``window - 5 s``) grows to ``GraceTime + window - 5 s`` once the
    answer names a preemption and the partition's GraceTime: the ranks get the checkpoint time
    the cluster grants them (policy.extend_grace; the envelope's ``stop.grace_from`` says so)."""

    def __init__(self, env: Mapping[str, str], supervisor: Callable[[], Supervisor],
                 window: float | None = None, grace_source: str | None = None) -> None:
        self.env = env
        self.supervisor = supervisor  # the attempt under way's
        self.window = window  # the scheduler's SIGTERM -> SIGKILL window (KillWait), if known
        self.grace_source = grace_source  # what set the grace: "--grace" is never changed
        self._task: asyncio.Task[dict[str, Any] | None] | None = None

    def on_event(self, event: ev.Event) -> None:
        if self._task is not None or not isinstance(event, ev.RunStopping):
            return
        sup = self.supervisor()
        if sup.stop is None or sup.stop.source != CancelSource.SIGNAL.value:
            return
        if not self.env.get("SLURM_JOB_ID"):
            return
        first = sup.cancels[0].sender if sup.cancels else None
        with contextlib.suppress(RuntimeError):  # no running loop: no answer
            self._task = asyncio.get_running_loop().create_task(scheduler_stop(
                self.env, None if first is None else first.as_dict(), event.at))
            self._task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task[dict[str, Any] | None]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        grace = preemption_grace(task.result(), self.window, self.grace_source)
        if grace is not None:
            self.supervisor().extend_grace(*grace)

    async def settle(self) -> dict[str, Any] | None:
        if self._task is None:
            return None
        try:
            # scontrol, sacct, then the preemption's grace reads (at once): three calls' time
            return await asyncio.wait_for(self._task, 3 * SCONTROL_WAIT + 0.5)
        except (TimeoutError, OSError):
            return None
