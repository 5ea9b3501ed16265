"""The GPU sampler in-process, against the fake NVML (tests/fake_nvml): devices and figures,
processes appearing, moving to another device and vanishing, descendants, figures a device does
not offer, NVML errors mid-run and a lost device; no NVML at all: nothing, once."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import rank_record
from fake_nvml.state import FAKE_DIR, GIB, device, process, write_state

from forgelm_tui.engine import gpu
from forgelm_tui.engine.gpu import GpuSampler, PidOwners
from forgelm_tui.engine.gpu_visible import visible_count
from forgelm_tui.engine.sampler import GpuFold, SamplingLoop
from forgelm_tui.plan.options import UsageError, parse_count

pytestmark = pytest.mark.timeout(30)

FakeNvml = tuple[ModuleType, Path]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """A fresh fake ``pynvml`` in sys.modules, its state file, and NVML not yet opened."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_DIR / "pynvml.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state = tmp_path / "nvml.json"
    write_state(state, [device(0), device(1)])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu, "_opened", [])
    yield module, state


def parents(tree: dict[int, int]) -> Callable[[int], int | None]:
    return lambda pid: tree.get(pid, 1)


def open_sampler(tree: dict[int, int] | None = None) -> GpuSampler:
    sampler = GpuSampler.open({}, PidOwners(parents(tree or {})))
    assert sampler is not None
    return sampler


def test_no_nvml_means_no_sampler_no_thread_and_one_try(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: no nvidia-ml-py
    monkeypatch.setattr(gpu, "_opened", [])
    threads = threading.active_count()
    assert GpuSampler.open({}) is None
    assert gpu.visible_gpu_count({}) == 0
    assert threading.active_count() == threads


def test_a_failing_nvml_init_is_tried_once(fake: FakeNvml) -> None:
    module, state = fake
    write_state(state, [], init_error="LibraryNotFound")
    loop = SamplingLoop(None, 1.0, list, lambda s: None, lambda g: None)  # type: ignore[arg-type]
    for _ in range(3):
        assert loop.gpu_pass({1234: 0}) is None
    assert loop.gpu_state == "unavailable"
    assert GpuSampler.open({}) is None
    assert module.CALLS["nvmlInit"] == 1


def test_no_device_is_no_gpu(fake: FakeNvml) -> None:
    _, state = fake
    write_state(state, [])
    assert GpuSampler.open({}) is None


def test_figures_and_the_ranks_on_each_device(fake: FakeNvml) -> None:
    _, state = fake
    write_state(state, [device(0, utilization=87, used=30 * GIB),
                        device(1, utilization=5, temperature=None, power_mw=None)],
                [process(100, 0, 20 * GIB), process(200, 1, 3 * GIB)])
    sample = open_sampler().sample({100: 0, 200: 1, 300: 2})
    first, second = sample.devices
    assert (first.index, first.utilization, first.memory_used, first.memory_total) == (
        0, 87.0, 30 * GIB, 80 * GIB)
    assert (first.temperature, first.power_watts) == (60, 250.0)
    assert (second.temperature, second.power_watts) == (None, None)
    by_rank = {r.rank: r for r in sample.ranks}
    assert [d.index for d in by_rank[0].devices] == [0]
    assert by_rank[0].memory_bytes == 20 * GIB
    assert [d.index for d in by_rank[1].devices] == [1]
    assert by_rank[2].devices == () and by_rank[2].memory_bytes is None


def test_processes_appear_move_and_vanish(fake: FakeNvml) -> None:
    _, state = fake
    sampler = open_sampler()
    ranks = {100: 0, 200: 1}
    assert all(r.devices == () for r in sampler.sample(ranks).ranks)  # before CUDA init
    write_state(state, [device(0), device(1)], [process(100, 0, GIB), process(200, 0, GIB)])
    assert [[d.index for d in r.devices] for r in sampler.sample(ranks).ranks] == [[0], [0]]
    write_state(state, [device(0), device(1)], [process(100, 0, GIB), process(200, 1, 5 * GIB)])
    moved = sampler.sample(ranks).ranks[1]
    assert [d.index for d in moved.devices] == [1] and moved.memory_bytes == 5 * GIB
    write_state(state, [device(0), device(1)], [process(100, 0, GIB)])
    assert sampler.sample(ranks).ranks[1].devices == ()


def test_descendants_are_the_ranks_and_their_parents_are_walked_once(fake: FakeNvml) -> None:
    _, state = fake
    walked: list[int] = []
    tree = {501: 500, 500: 200, 900: 1}  # 501 -> 500 -> rank 1's main process; 900 no rank's

    def parent(pid: int) -> int | None:
        walked.append(pid)
        return tree.get(pid, 1)

    sampler = GpuSampler.open({}, PidOwners(parent))
    assert sampler is not None
    write_state(state, [device(0), device(1)],
                [process(501, 1, 2 * GIB), process(500, 1, GIB), process(900, 0, 7 * GIB)])
    for _ in range(3):
        rank1 = sampler.sample({100: 0, 200: 1}).ranks[1]
        assert [d.index for d in rank1.devices] == [1] and rank1.memory_bytes == 3 * GIB
    assert sorted(walked) == [500, 501, 900]  # once each, not once a pass


def test_a_real_process_tree(fake: FakeNvml) -> None:
    """The rank's grandchild holds the GPU: found through /proc, not assumed from LOCAL_RANK."""
    _, state = fake
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(30)']); print(c.pid, flush=True); time.sleep(30)")
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert rank.stdout is not None
        child = int(rank.stdout.readline())
        write_state(state, [device(0), device(1)], [process(child, 1, 4 * GIB)])
        sampler = GpuSampler.open({})
        assert sampler is not None
        held = sampler.sample({rank.pid: 3}).ranks[0]
        assert (held.rank, [d.index for d in held.devices], held.memory_bytes) == (3, [1], 4 * GIB)
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)
        rank.kill()
        rank.wait()


def test_figures_not_offered_are_not_asked_again(fake: FakeNvml) -> None:
    module, state = fake
    write_state(state, [device(0, temperature=None, power_mw=None)])
    sampler = open_sampler()
    for _ in range(4):
        sampler.sample({})
    assert module.CALLS["nvmlDeviceGetTemperature"] == 1
    assert module.CALLS["nvmlDeviceGetPowerUsage"] == 1
    assert module.CALLS["nvmlDeviceGetUtilizationRates"] == 4


def test_memory_as_nvidia_smi_counts_it_v1_on_an_old_driver(fake: FakeNvml) -> None:
    _, state = fake
    old = device(1, used=3 * GIB) | {"memory_reserved": GIB // 2, "memory_v2": False}
    write_state(state, [device(0, used=3 * GIB) | {"memory_reserved": GIB // 2}, old])
    sampler = open_sampler()
    for _ in range(2):
        new_driver, old_driver = sampler.sample({}).devices
        assert new_driver.memory_used == 3 * GIB  # v2: without the reservation
        assert old_driver.memory_used == 3 * GIB + GIB // 2  # v1 after v2 was refused once


@pytest.mark.parametrize("error", ["GpuIsLost", "Unknown"])
def test_a_lost_device_is_marked_and_sampling_goes_on(fake: FakeNvml, error: str) -> None:
    module, state = fake
    processes = [process(100, 0, GIB), process(200, 1, GIB)]
    write_state(state, [device(0), device(1)], processes)
    sampler = open_sampler()
    sampler.sample({100: 0, 200: 1})
    write_state(state, [device(0, utilization=66), device(1, error=error)], processes)
    for _ in range(2):
        sample = sampler.sample({100: 0, 200: 1})
        first, second = sample.devices
        assert first.utilization == 66 and not first.lost
        assert second.lost and second.utilization is None and second.memory_used is None
        on_lost = sample.ranks[1]  # still shown on the device it held, as lost
        assert [d.index for d in on_lost.devices] == [1] and on_lost.devices[0].lost
    calls = module.CALLS["nvmlDeviceGetComputeRunningProcesses"]
    sampler.sample({100: 0, 200: 1})
    assert module.CALLS["nvmlDeviceGetComputeRunningProcesses"] == calls + 1  # device 0 only


def test_a_passing_error_is_one_missing_sample(fake: FakeNvml) -> None:
    _, state = fake
    processes = [process(100, 1, GIB)]
    sampler = open_sampler()
    write_state(state, [device(0), device(1, error="Timeout")], processes)
    timed_out = sampler.sample({100: 0}).devices[1]
    assert not timed_out.lost and timed_out.utilization is None
    write_state(state, [device(0), device(1, utilization=12)], processes)
    back = sampler.sample({100: 0})
    assert back.devices[1].utilization == 12 and [d.index for d in back.ranks[0].devices] == [1]


def test_a_device_failing_from_the_start_is_lost_and_the_others_sampled(fake: FakeNvml) -> None:
    _, state = fake
    write_state(state, [device(0, error="GpuIsLost"), device(1)], [process(100, 1, GIB)])
    first, second = open_sampler().sample({100: 0}).devices
    assert first.lost and first.uuid == "unknown-0"
    assert not second.lost and second.utilization == 40


def test_header_devices_are_the_visible_ones_and_those_ranks_hold(
        fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    _, state = fake
    write_state(state, [device(0), device(1), device(2)], [process(100, 2, GIB)])
    sampler = GpuSampler.open({"CUDA_VISIBLE_DEVICES": "1"}, PidOwners(parents({})))
    assert sampler is not None
    assert [d.index for d in sampler.sample({100: 0}).devices] == [1, 2]


def test_the_fold_keeps_every_device_held_and_the_peak(fake: FakeNvml) -> None:
    _, state = fake
    record = rank_record(0, pid=100, started_mono=1.0)
    events: list[object] = []
    fold = GpuFold({0: record}, events.append)
    sampler = open_sampler()
    for dev, used in ((0, 2 * GIB), (0, 9 * GIB), (1, 4 * GIB)):
        write_state(state, [device(0), device(1)], [process(100, dev, used)])
        fold(sampler.sample({100: 0}))
    assert record.peak_gpu_memory_bytes == 9 * GIB
    assert record.gpu_uuids == [device(0)["uuid"], device(1)["uuid"]]
    assert record.gpu is not None and record.gpu.devices[0].index == 1
    assert len(events) == 3 and record.snapshot().gpu == record.gpu


@pytest.mark.parametrize(("value", "count"), [
    (None, 4), ("", 0), ("0,1", 2), ("1", 1), ("3,1", 2), ("1,7,2", 1), ("0,0", 0),
    ("2,-1,3", 1), ("1gpu,2", 2), ("GPU-00000002", 1), ("GPU-00000001,GPU-00000003", 2),
    ("GPU-0000000", 0), ("GPU-00000001,GPU-00000001", 0), ("MIG-a,MIG-b", 2), ("x", 0),
])
def test_cuda_visible_devices_read_as_torch_reads_it(value: str | None, count: int) -> None:
    uuids = [device(i)["uuid"] for i in range(4)]
    assert visible_count(value, uuids) == count


def test_nproc_gpu_and_auto(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    _, state = fake
    write_state(state, [device(0), device(1), device(2)])
    assert parse_count("gpu", "--nproc-per-node", 1) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert parse_count("gpu", "--nproc-per-node", 1) == 2
    assert parse_count("auto", "--nproc-per-node", 1) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UsageError, match="no GPU visible"):
        parse_count("gpu", "--nproc-per-node", 1)
    assert parse_count("auto", "--nproc-per-node", 1) == len(os.sched_getaffinity(0))


def test_nproc_gpu_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(gpu, "_opened", [])
    with pytest.raises(UsageError, match="no GPU visible"):
        parse_count("gpu", "--nproc-per-node", 1)
    assert parse_count("auto", "--nproc-per-node", 1) == len(os.sched_getaffinity(0))


def test_on_this_machine_the_real_nvml_is_unavailable_and_costs_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-ml-py installed, no NVIDIA library or driver: one failed init, no thread."""
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(gpu, "_opened", [])
    threads = set(threading.enumerate())
    loop = SamplingLoop(None, 1.0, list, lambda s: None, lambda g: None)  # type: ignore[arg-type]
    first = loop.gpu_pass({os.getpid(): 0})
    if loop.gpu_state == "on":
        pytest.skip("this machine has a GPU")
    assert first is None and loop.gpu_state == "unavailable" and loop.gpu is None
    assert loop.gpu_pass({os.getpid(): 0}) is None
    assert set(threading.enumerate()) == threads


def test_nothing_imports_pynvml_until_a_sample_pass_asks() -> None:
    probe = ("import sys\nimport forgelm_tui.cli, forgelm_tui.plan.planner, "
             "forgelm_tui.session.run, "
             "forgelm_tui.headless.view, forgelm_tui.engine.supervisor, forgelm_tui.tui.app\n"
             "print('pynvml' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=90, check=True).stdout  # ~1 s; more while SLURM jobs start
    assert out.strip() == "False"


def test_multi_node_root_cause_gpu_comes_from_its_node() -> None:
    from conftest import rk
    from test_cluster_liveness import F, final, info, stop, wire

    from forgelm_tui.cluster import agreement
    from forgelm_tui.engine.codec import decode
    from forgelm_tui.envelope.build import build
    from forgelm_tui.session.outcome import Agreement, NodeOutcome, RunFrame, RunOutcome
    from forgelm_tui.verdict import StopKind

    sample = {"rank": 3, "at": "2026-12-01T00:00:00.000Z", "memory_bytes": 79 * GIB,
              "devices": []}
    finals = {0: final(0, [rk(0, 143, t=6.0, signalled=True), rk(1, 7, t=5.0)],
                       gpu_samples=({**sample, "rank": 1},)),
              1: final(1, [rk(2, 0, t=9001.0, signalled=True), rk(3, 9, t=9000.0)],
                       gpu_samples=(sample,))}
    record = wire(stop(StopKind.FAILURE, origin_rank=3, origin_node=1))
    verdict = agreement.decide_global(finals, record, F)
    outcome = RunOutcome(verdict, RunFrame(), tuple(
        decode(NodeOutcome, f["outcome"]) for _, f in sorted(finals.items())),
        stop=agreement.agreed_stop(None, record), agreement=Agreement(True, 0, (), 2))
    envelope = build(info(0), outcome, run_dir="/runs/x/node-0")
    assert envelope["root_cause_rank"] == 3 and envelope["root_cause_gpu"] == sample


def test_the_headless_line_comes_on_a_change_and_every_30_s() -> None:
    from forgelm_tui.engine.events import GpuDevice, GpuSampled, RankGpu
    from forgelm_tui.wording.gpu import GpuStatus

    now = [0.0]
    status = GpuStatus(clock=lambda: now[0])
    gpus = (GpuDevice(0, "GPU-a", "H100", 87.0, 30 * GIB, 80 * GIB, 61, 250.0),
            GpuDevice(1, "GPU-b", "H100", None, None, None, lost=True))

    def event(on: int | None) -> GpuSampled:
        held = () if on is None else (gpus[on],)
        return GpuSampled(gpus, (RankGpu(0, held, 20 * GIB if held else None),
                                 RankGpu(1, (), None)), 0.0)

    assert status.line(event(0)) == ("gpu: gpu0 87% 30.0/80.0 GiB 61C 250 W (rank 0 20.0 GiB); "
                                     "gpu1 lost; no GPU: rank 1")
    now[0] = 29.0
    assert status.line(event(0)) is None
    assert status.line(event(1)) == "gpu: gpu0 87% 30.0/80.0 GiB 61C 250 W; " \
                                    "gpu1 lost (rank 0 20.0 GiB); no GPU: rank 1"
    now[0] = 58.0
    assert status.line(event(1)) is None
    now[0] = 59.5
    assert status.line(event(1)) is not None
    assert status.index == {"GPU-a": 0, "GPU-b": 1}
