"""Kubernetes (issue 24): pods configured only by the operator's variables (Kubeflow's
PyTorchJob: PET_* for torchrun, MASTER_* / WORLD_SIZE / RANK for the pod) form one run with
the true code; a master whose name does not resolve yet is waited for, with a line. Each "pod"
is a forgelm-tui on 127.0.0.1 (docs/schedulers.md, "Kubernetes")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from cluster_nodes import Node, free_port_pair, no_orphans, same_envelopes, wait_all
from conftest import cli_env, dies_with_the_test, pid_alive, wait_for

pytestmark = pytest.mark.timeout(120)


def pod(index: int, pods: int, port: int, tmp_path: Path, *args: str,
        master: str = "127.0.0.1", extra: dict[str, str] | None = None,
        wrap: Sequence[str] = ()) -> Node:
    """A PyTorchJob pod's container: the operator's variables exactly (trainer v1.9,
    pkg/controller.v1/pytorch: envvar.go, master.go), ``nprocPerNode: "2"``."""
    env = {"PET_NNODES": str(pods), "PET_NODE_RANK": str(index), "PET_NPROC_PER_NODE": "2",
           "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(port), "MASTER_ADDR": master,
           "MASTER_PORT": str(port), "WORLD_SIZE": str(pods * 2), "RANK": str(index),
           "PYTHONUNBUFFERED": "1", **(extra or {})}
    cmd = [*wrap, sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir",
           str(tmp_path / "run"), *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=dies_with_the_test)
    return Node(index, proc, tmp_path / "run")


def test_two_pods_with_only_the_operators_variables_are_one_run_with_the_true_code(
        tmp_path: Path) -> None:
    port = free_port_pair()
    pods = [pod(i, 2, port, tmp_path, "demo", "--steps", "3", "--exit-code", "4")
            for i in range(2)]
    codes = wait_all(pods, 90)
    outputs = [p.output() for p in pods]
    assert codes == [4, 4], outputs
    envelope = same_envelopes(pods)
    assert envelope["world_size"] == 4 and envelope["exit_code"] == 4
    assert [r["rank"] for r in envelope["ranks"]] == [0, 1, 2, 3]
    no_orphans([int(r["pid"]) for r in envelope["ranks"] if r.get("pid")])


@pytest.mark.parametrize("nnodes", ["1:2", "2"], ids=["min-max", "worker-replicas"])
def test_two_pods_of_an_elastic_policy_are_one_run_with_the_true_code(tmp_path: Path,
                                                                      nnodes: str) -> None:
    """A PyTorchJob with an ``elasticPolicy`` (trainer v1.9, elastic.go): workers only, no
    PET_NODE_RANK, MASTER_* or RANK; PET_RDZV_ENDPOINT is worker 0's service; PET_NNODES is
    ``MIN:MAX`` or, without them, the worker replicas. Both pods are started at once with the
    same variables, as the operator does: the one that binds the endpoint's port hosts (each
    pod's run dir is its own volume)."""
    port = free_port_pair()
    env = {"PET_RDZV_ENDPOINT": f"127.0.0.1:{port}", "PET_RDZV_BACKEND": "c10d",
           "PET_NNODES": nnodes, "PET_MAX_RESTARTS": "1", "PET_NPROC_PER_NODE": "2",
           "PET_RDZV_ID": "job", "PYTHONUNBUFFERED": "0"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir", str(tmp_path / f"pod{i}"),
         "demo", "--steps", "3", "--exit-code", "4"], cwd=tmp_path, env=cli_env(env),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=dies_with_the_test) for i in range(2)]
    outputs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [4, 4], outputs
    envelopes = [json.loads(next((tmp_path / f"pod{i}").glob("node-*/envelope.json")).read_text())
                 for i in range(2)]
    assert sorted(e["node_rank"] for e in envelopes) == [0, 1]
    for envelope in envelopes:
        assert envelope["world_size"] == 4 and envelope["exit_code"] == 4
        assert [r["rank"] for r in envelope["ranks"]] == [0, 1, 2, 3]
    no_orphans([int(r["pid"]) for r in envelopes[0]["ranks"] if r.get("pid")])


def test_a_master_whose_name_does_not_resolve_yet_is_waited_for_with_a_line(
        tmp_path: Path) -> None:
    """Pods start in any order: node 0's service name may not resolve yet. Retried until
    --join-timeout (then 1, naming it), never refused at once. No resolver is asked (no test
    depends on the network: one here took 5 s to answer once): the pod runs in a network
    namespace of its own (as root, as CI), where the lookup fails at once; elsewhere glibc is
    told to give up on a resolver after 1 s (RES_OPTIONS), and the name is in .invalid."""
    name = "job-master-0.forgelm-tui-test.invalid"
    wrap = ["unshare", "--net"] if can_unshare() else []
    node = pod(1, 2, free_port_pair(), tmp_path, "--join-timeout", "3", "demo", master=name,
               extra={"RES_OPTIONS": "timeout:1 attempts:1", "LOCALDOMAIN": ""}, wrap=wrap)
    assert node.wait(60) == 1
    out, err = node.output()
    err = out + err  # the headless lines
    assert f"node 0's address {name} does not resolve yet: retrying until the join timeout " \
           "(3 s)" in err
    assert err.count("does not resolve yet") == 1  # said once
    assert f"node 0's address {name} never resolved" in node.envelope()["error"]
    assert "Traceback" not in err


def test_a_master_name_that_can_never_resolve_is_refused_at_once(tmp_path: Path) -> None:
    name = "job-master-0-" + "x" * 60 + ".default.svc"  # a label over 63 characters
    node = pod(1, 2, free_port_pair(), tmp_path, "demo", master=name)
    assert node.wait(60) == 1
    _, err = node.output()
    assert f"--master-addr (from PET_MASTER_ADDR) {name!r} is not a host name or address" in err
    assert "Traceback" not in err and "forgelm-tui failed" not in err


def test_the_join_says_once_that_node_0s_name_does_not_resolve_and_again_after_it_did(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from forgelm_tui.cluster import join
    from forgelm_tui.cluster.config import ClusterConfig
    from forgelm_tui.cluster.join import Joiner

    answers = iter([False, False, True, False])

    def resolve(host: str, port: object, **kwargs: object) -> list[object]:
        if not next(answers):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return []  # resolves, nothing listens

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    lines: list[str] = []
    config = ClusterConfig(2, 1, "job-master-0", 23457, "job-master-0", 23456, "r", True, 2,
                           join_timeout=300.0)
    joiner = Joiner(config, lambda: False, notice=lines.append)
    for expected in (None, None, False, None):
        listening = join._listening("job-master-0", 23457)
        assert listening is expected
        joiner._resolves("job-master-0", listening is not None)
    assert lines == ["node 0's address job-master-0 does not resolve yet: retrying until the "
                     "join timeout (300 s)"] * 2  # once, and once more after it resolved
    assert joiner.unresolved


def test_the_join_tries_node_0_once_even_when_importing_torch_used_the_join_timeout_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CI (a loaded machine) took longer than a 3 s join timeout to import torch, and the join
    gave up before asking: "never answered" for a name that never resolved. One try first."""
    from forgelm_tui.cluster import join
    from forgelm_tui.cluster.config import ClusterConfig
    from forgelm_tui.cluster.join import Joiner, JoinRefused

    asked: list[str] = []

    def resolve(host: str, port: object, **kwargs: object) -> list[object]:
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(join, "_is_local", lambda host: False)
    now = [0.0]
    config = ClusterConfig(2, 1, "job-master-0", 23457, "job-master-0", 23456, "r", True, 2,
                           join_timeout=3.0)
    lines: list[str] = []
    joiner = Joiner(config, lambda: False, clock=lambda: now[0], notice=lines.append)
    now[0] = 10.0  # the import took 10 s
    with pytest.raises(JoinRefused) as refused:
        joiner._open()
    assert asked == ["job-master-0"]
    assert str(refused.value) == ("node 0's address job-master-0 never resolved: join timeout "
                                  "of 3 s")
    assert lines == ["node 0's address job-master-0 does not resolve yet: retrying until the "
                     "join timeout (3 s)"]


# ---------------------------------------------------------------------- PID 1 of its container

ORPHAN_THEN_WAIT = """
import os, sys, time
marks = sys.argv[1]
if os.environ["LOCAL_RANK"] == "0" and os.fork() == 0:  # an orphan: its parent exits at once
    if os.fork() == 0:
        time.sleep(0.5)
        open(os.path.join(marks, "orphan-ended"), "w").close()
        os._exit(0)
    os._exit(0)
open(os.path.join(marks, "ready-" + os.environ["LOCAL_RANK"]), "w").close()
time.sleep(120)
"""


def can_unshare() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


needs_pid_namespace = pytest.mark.skipif(not can_unshare(), reason="needs root (unshare --pid)")


def read_proc(pid: int, name: str) -> str:
    """/proc/<pid>/<name>, or "" when the process is gone (reaped since it was listed)."""
    try:
        return Path(f"/proc/{pid}/{name}").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").glob("*")
            for child in read_proc(pid, f"task/{task.name}/children").split()]


class Pid1:
    """``unshare --pid --fork --mount-proc forgelm-tui ...``: forgelm-tui as PID 1 of a PID
    namespace (a container's entrypoint), seen from here by its host pid."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "forgelm_tui",
               "--no-tui", "--run-dir", str(tmp_path / "run"), *args]
        self.proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, preexec_fn=dies_with_the_test)
        self.pid = wait_for(self._find, 30, "forgelm-tui as PID 1")

    def _find(self) -> int | None:
        for pid in children(self.proc.pid):
            status = read_proc(pid, "status")
            nspid = [line for line in status.splitlines() if line.startswith("NSpid")]
            if nspid and nspid[0].split()[-1] == "1":
                return pid
        return None

    def zombies(self) -> list[int]:
        """Its children that ended and were not reaped."""
        found = []
        for pid in children(self.pid):
            stat = read_proc(pid, "stat")  # "" once reaped between the listing and the read
            if ")" in stat and stat.rsplit(")", 1)[1].split()[0] == "Z":
                found.append(pid)
        return found

    def namespace_empty(self) -> bool:
        return self.proc.poll() is not None and not pid_alive(self.pid)


@needs_pid_namespace
def test_pid_1_reaps_orphans_stops_on_sigterm_and_returns_the_true_code(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "rank.py").write_text(ORPHAN_THEN_WAIT)
    pid1 = Pid1(tmp_path, "--nproc-per-node", "2", str(tmp_path / "rank.py"), str(marks))
    wait_for(lambda: len(list(marks.glob("ready-*"))) == 2, 30, "the ranks")
    wait_for(lambda: (marks / "orphan-ended").exists(), 15, "the orphan's end")
    wait_for(lambda: not pid1.zombies(), 15, "the orphan's zombie reaped by PID 1")
    os.kill(pid1.pid, signal.SIGTERM)  # the kubelet's, at a pod's deletion or preemption
    assert pid1.proc.wait(60) == 2  # interrupted (SPEC §5): ForgeLM's contract
    out, err = pid1.proc.communicate(timeout=10)
    assert "cancelled by SIGTERM to the supervisor" in out and "Traceback" not in out + err
    envelope = json.loads((tmp_path / "run" / "envelope.json").read_text())
    assert envelope["exit_code"] == 2 and envelope["stop"]["kind"] == "cancel"
    wait_for(pid1.namespace_empty, 15, "nothing left")


@needs_pid_namespace
@pytest.mark.parametrize(("contract", "code"), [("forgelm", 2), ("raw", 143)])
def test_a_preempted_pod_returns_2_permanent_or_143_retried(tmp_path: Path, contract: str,
                                                           code: int) -> None:
    """Kubeflow's restartPolicy ExitCode retries 128-255 and not 1-127 (trainer v1.9,
    IsRetryableExitCode): a preempted pod whose ranks die of the SIGTERM returns 2 under
    ForgeLM's contract (not retried: the run is interrupted, CI says so) and 143 under
    --exit-contract raw (retried)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "rank.py").write_text(ORPHAN_THEN_WAIT)
    pid1 = Pid1(tmp_path, "--exit-contract", contract, "--nproc-per-node", "2",
                str(tmp_path / "rank.py"), str(marks))
    wait_for(lambda: len(list(marks.glob("ready-*"))) == 2, 30, "the ranks")
    os.kill(pid1.pid, signal.SIGTERM)
    assert pid1.proc.wait(60) == code
    wait_for(pid1.namespace_empty, 15, "nothing left")


@needs_pid_namespace
def test_sigkill_of_pid_1_leaves_the_envelope_written_when_the_stop_began(tmp_path: Path) -> None:
    """terminationGracePeriodSeconds ran out: the kubelet's SIGKILL ends PID 1 and with it the
    namespace; what survives is the envelope written when the stop began (provisional)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sleeper = str(Path(__file__).parent / "ranks" / "sleeper.py")
    pid1 = Pid1(tmp_path, "--nproc-per-node", "2", sleeper, str(marks), "--ignore-term", "0")
    wait_for(lambda: len(list(marks.glob("ready-*"))) == 2, 30, "the ranks")
    os.kill(pid1.pid, signal.SIGTERM)
    envelope = tmp_path / "run" / "envelope.json"
    wait_for(lambda: envelope.exists() and json.loads(envelope.read_text()).get("stop"), 15,
             "the envelope of the stop's start")
    os.kill(pid1.pid, signal.SIGKILL)
    assert pid1.proc.wait(30) in (-signal.SIGKILL, 128 + signal.SIGKILL, 1)
    written = json.loads(envelope.read_text())
    assert written["provisional"] and written["exit_code"] == 2
    assert written["stop"]["reason"] == "cancelled by SIGTERM to the supervisor"
    wait_for(pid1.namespace_empty, 15, "nothing left")
