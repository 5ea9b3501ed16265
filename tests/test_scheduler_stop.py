"""Why the scheduler stopped the job (stop.scheduler), from scontrol's answer: parsing and the
rules, in-process. The real answers are read on a real SLURM cluster (test_slurm_cluster.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from forgelm_tui.cluster.scheduler_stop import (
    classify,
    config_value,
    grace_time,
    limit_seconds,
    parse_job,
    preemption_grace,
    preemption_grace_time,
    qos_grace_time,
)

pytestmark = pytest.mark.timeout(10)

LINE = ("JobId=42 JobName=train UserId=root(0) GroupId=root(0) Priority=1 JobState={state} "
        "Reason={reason} Dependency=(null) RunTime=00:01:07 TimeLimit=00:01:00 "
        "StartTime=2026-12-03T08:00:00 EndTime=2026-12-03T08:01:00 Command=/bin/sh -c x y")
ENV = {"SLURM_JOB_ID": "42"}


def job(state: str, reason: str = "None") -> dict[str, str]:
    return parse_job(LINE.format(state=state, reason=reason))


def test_parse_takes_key_value_pairs() -> None:
    fields = job("TIMEOUT", "TimeLimit")
    assert (fields["JobId"], fields["JobState"], fields["Reason"]) == ("42", "TIMEOUT",
                                                                      "TimeLimit")
    assert fields["EndTime"] == "2026-12-03T08:01:00"


@pytest.mark.parametrize(("state", "kind"), [
    ("TIMEOUT", "time_limit"), ("CANCELLED", "scancel"), ("PREEMPTED", "preempted"),
    ("NODE_FAIL", "node_failure"), ("FAILED", "unknown")])
def test_the_job_state_names_the_kind(state: str, kind: str) -> None:
    cause = classify(ENV, job(state), {"pid": 7, "kind": "scheduler"}, at=0.0)
    assert cause["kind"] == kind
    assert cause["evidence"]["job_state"] == state and cause["evidence"]["sender"]["pid"] == 7


def test_a_job_past_its_start_and_limit_is_at_its_time_limit() -> None:
    """slurmctld says COMPLETING at first, whatever the cause: the limit decides, never EndTime
    (a cancelled job's is the moment of the cancel)."""
    from datetime import datetime
    start = datetime.fromisoformat("2026-12-03T08:00:00").timestamp()
    completing = job("COMPLETING")
    assert classify(ENV, completing, None, at=start + 60.5)["kind"] == "time_limit"
    cancelled = classify(ENV, completing, None, at=start + 30)  # EndTime passed, limit not
    assert cancelled["kind"] == "unknown"
    assert cancelled["evidence"]["time_limit_at"] == start + 60


def test_accountings_state_names_the_cause_while_slurmctld_says_completing() -> None:
    cause = classify(ENV, job("COMPLETING"), None, at=0.0, accounted="CANCELLED by 0")
    assert cause["kind"] == "scancel" and cause["evidence"]["accounted_state"] == "CANCELLED by 0"


def test_without_scontrol_the_environments_end_time_decides() -> None:
    env = {**ENV, "SLURM_JOB_END_TIME": "1000"}
    assert classify(env, None, None, at=999.5)["kind"] == "time_limit"
    cause = classify(env, None, None, at=900.0)
    assert cause["kind"] == "unknown" and cause["evidence"]["scontrol"] is False


@pytest.mark.parametrize(("text", "seconds"), [
    ("00:01:00", 60), ("5", 300), ("05:30", 330), ("1-00:00:00", 86400),
    ("2-03", 2 * 86400 + 3 * 3600), ("1-01:02", 86400 + 3600 + 120), ("UNLIMITED", None),
    ("", None)])
def test_slurm_time_limits_are_read(text: str, seconds: float | None) -> None:
    assert limit_seconds(text) == seconds


def test_a_job_in_its_preemption_grace_time_is_preempted() -> None:
    """Measured: during GraceTime slurmctld says RUNNING, with PreemptTime set."""
    running = parse_job("JobId=42 JobState=RUNNING Reason=None StartTime=2026-12-03T08:00:00 "
                        "TimeLimit=UNLIMITED PreemptTime=2026-12-03T08:10:00 EndTime=Unknown")
    from datetime import datetime
    at = datetime.fromisoformat("2026-12-03T08:10:00").timestamp()
    cause = classify(ENV, running, None, at=at + 0.2, accounted="RUNNING")
    assert cause["kind"] == "preempted" and cause["evidence"]["preempt_time"] == at
    assert classify(ENV, job("RUNNING"), None, at=0.0)["kind"] == "unknown"  # PreemptTime absent


def test_a_partitions_grace_time_is_read() -> None:
    line = ("PartitionName=low AllowGroups=ALL Default=NO GraceTime=300 Hidden=NO "
            "PreemptMode=CANCEL State=UP")
    assert grace_time(line) == 300.0
    assert grace_time("PartitionName=x GraceTime=bad") is None
    assert grace_time(None) is None and grace_time("PartitionName=x") is None


@pytest.mark.parametrize(("cause", "window", "source", "grace"), [
    # a preemption: GraceTime + the window, less the margin for forgelm-tui's own end
    ({"kind": "preempted", "evidence": {"grace_time": 300.0}}, 30.0, "SLURM KillWait", 325.0),
    ({"kind": "preempted", "evidence": {"grace_time": 5.0}}, 10.0, "--kill-wait", 10.0),
    ({"kind": "preempted", "evidence": {"grace_time": 5.0}}, 10.0, "--grace", None),  # explicit
    ({"kind": "preempted", "evidence": {"grace_time": 0.0}}, 30.0, "SLURM KillWait", None),
    ({"kind": "preempted", "evidence": {"grace_time": None}}, 30.0, "SLURM KillWait", None),
    ({"kind": "preempted", "evidence": {"grace_time": 60.0}}, None, "default", None),
    ({"kind": "time_limit", "evidence": {}}, 30.0, "SLURM KillWait", None),
    (None, 30.0, "SLURM KillWait", None),
])
def test_a_preemption_grows_a_derived_grace_to_its_window(
        cause: dict[str, object] | None, window: float | None, source: str,
        grace: float | None) -> None:
    found = preemption_grace(cause, window, source)
    assert (None if found is None else found[0]) == grace, found
    if found is not None:
        assert found[1].startswith("preempted: GraceTime ") and source in found[1]


# As the test cluster's slurmctld 22.05 and sacctmgr print them (FSLURM_PREEMPT=qos).
CONFIG = ("Configuration data as of 2026-12-04T22:41:01\nPreemptMode             = CANCEL\n"
          "PreemptType             = {type}\nPreemptExemptTime       = 00:00:00\n")


def test_a_setting_of_scontrol_show_config_is_read() -> None:
    config = CONFIG.format(type="preempt/qos")
    assert config_value(config, "PreemptType") == "preempt/qos"
    assert config_value(config, "PreemptMode") == "CANCEL"
    assert config_value(config, "Preempt") is None and config_value(None, "PreemptType") is None


@pytest.mark.parametrize(("text", "seconds"), [
    ("00:00:05\n", 5.0), ("00:00:00\n", 0.0), ("00:10:00", 600.0), ("1-00:00:00", 86400.0),
    ("", None), (None, None), ("5", None), ("00:00:05\n00:00:10\n", None)])
def test_a_qos_grace_time_is_read(text: str | None, seconds: float | None) -> None:
    assert qos_grace_time(text) == seconds


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preempt_type: str) -> None:
    """scontrol and sacctmgr on PATH, answering as the cluster would: partition low's
    GraceTime 30, QOS low's 5 (sacctmgr prints nothing for a QOS that does not exist)."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\n"
                        f"[ \"$2\" = config ] && printf '{CONFIG.format(type=preempt_type)}'\n"
                        "[ \"$2\" = partition ] && echo PartitionName=$4 GraceTime=30\n"
                        "exit 0\n")
    sacctmgr = tmp_path / "sacctmgr"
    sacctmgr.write_text('#!/bin/sh\n[ "$5" = low ] && echo 00:00:05\nexit 0\n')
    for tool in (scontrol, sacctmgr):
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(("preempt_type", "qos", "grace", "of"), [
    ("preempt/qos", "low", 5.0, "QOS low"),
    ("preempt/qos", "gone", None, "QOS gone"),
    ("preempt/partition_prio", "low", 30.0, "partition low"),
    ("", "low", 30.0, "partition low"),  # the type unknown: the partition's, as before
])
async def test_the_grace_time_comes_from_where_slurmctld_takes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preempt_type: str, qos: str,
        grace: float | None, of: str) -> None:
    """slurmctld's preempt plugins: preempt/qos gives the job's QOS's GraceTime,
    preempt/partition_prio its partition's (a QOS-preempted job in a partition with
    none got no more than KillWait before)."""
    fake_slurm(tmp_path, monkeypatch, preempt_type)
    found = await preemption_grace_time({"SLURM_JOB_PARTITION": "low"}, {"QOS": qos})
    assert (found["grace_time"], found["grace_time_of"]) == (grace, of)
    assert found["preempt_type"] == (preempt_type or None)
