"""Why the scheduler stopped the job: ``stop.scheduler = {"kind", "evidence"}`` (issue 20).

Asked once, when a stop from a signal to the supervisor begins inside a SLURM job
(``SLURM_JOB_ID``): ``scontrol show job -o <id>`` gives the job's state as slurmctld sees it
then. The kind:

| kind | evidence |
|---|---|
| ``time_limit`` | JobState ``TIMEOUT``, or the job's ``EndTime`` (``SLURM_JOB_END_TIME``) reached |
| ``scancel`` | JobState ``CANCELLED`` |
| ``preempted`` | JobState ``PREEMPTED`` |
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

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.records import CancelSource

if TYPE_CHECKING:
    from forgelm_tui.engine.supervisor import Supervisor

SCONTROL_WAIT = 3.0  # seconds: the envelope must be on disk well before KillWait ends
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


def classify(env: Mapping[str, str], job: Mapping[str, str] | None, sender: dict[str, Any] | None,
             at: float) -> dict[str, Any]:
    """The scheduler's reason for the stop that began at ``at`` (epoch seconds)."""
    state = (job or {}).get("JobState")
    end = _epoch((job or {}).get("EndTime")) or _epoch(env.get("SLURM_JOB_END_TIME"))
    evidence: dict[str, Any] = {
        "job_id": env.get("SLURM_JOB_ID"), "job_state": state,
        "reason": (job or {}).get("Reason"), "end_time": end,
        "scontrol": job is not None, "sender": sender}
    kind = _STATES.get(state or "")
    if kind is None and end is not None and at >= end - END_MARGIN:
        kind = "time_limit"
    return {"kind": kind or "unknown", "evidence": evidence}


async def read_job(job_id: str, wait: float = SCONTROL_WAIT) -> dict[str, str] | None:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        proc = await asyncio.create_subprocess_exec(
            scontrol, "show", "job", "-o", job_id, stdin=asyncio.subprocess.DEVNULL,
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
    return parse_job(out.decode("utf-8", "replace")) if proc.returncode == 0 else None


async def scheduler_stop(env: Mapping[str, str], sender: dict[str, Any] | None,
                         at: float | None = None) -> dict[str, Any] | None:
    """The stop's scheduler cause inside a SLURM job; None outside one."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    at = time.time() if at is None else at
    return classify(env, await read_job(job_id), sender, at)


class SchedulerCause:
    """A listener: when a stop from a signal to the supervisor begins inside a SLURM job (its
    own, or another node's record of one), asks slurmctld why, once, in the background;
    :meth:`settle` gives the answer for the envelope."""

    def __init__(self, env: Mapping[str, str], supervisor: Callable[[], Supervisor]) -> None:
        self.env = env
        self.supervisor = supervisor  # the attempt under way's
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

    async def settle(self) -> dict[str, Any] | None:
        if self._task is None:
            return None
        try:
            return await asyncio.wait_for(self._task, SCONTROL_WAIT + 1.0)
        except (TimeoutError, OSError):
            return None
