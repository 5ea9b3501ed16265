"""A real run with the fake NVML (tests/fake_nvml first on the supervisor's PYTHONPATH): the
headless GPU line shows each rank's device and memory, a rank whose process moves is shown on
its new device, the envelope's peak memory is the fake's maximum and the root cause's last GPU
sample is in the envelope. Without it, on this CPU machine: no GPU anywhere."""

from __future__ import annotations

import queue
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import Run, rank_script, run_cli, start, wait_for
from fake_nvml.state import GIB, device, fake_env, process, write_state

pytestmark = pytest.mark.timeout(90)


class Lines:
    """The supervisor's stdout, read in a thread; ``wait`` for a line with a deadline."""

    def __init__(self, run: Run) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        assert run.proc.stdout is not None
        stdout = run.proc.stdout
        threading.Thread(target=lambda: [self._queue.put(line) for line in stdout],
                         daemon=True).start()

    def wait(self, pattern: str, timeout: float = 30) -> str:
        def found() -> str | None:
            while not self._queue.empty():
                self.seen.append(self._queue.get())
            return next((line for line in self.seen if re.search(pattern, line)), None)

        return str(wait_for(found, timeout, f"a line like {pattern!r}"))


def pids(where: Path, ranks: int) -> list[tuple[int, int]]:
    def ready() -> list[tuple[int, int]] | None:
        files = [where / f"rank-{r}.pids" for r in range(ranks)]
        if not all(f.exists() for f in files):
            return None
        return [(int(a), int(b)) for a, b in (f.read_text().split() for f in files)]

    return list(wait_for(ready, 30, "the ranks' pid files"))


def gpu_run(tmp_path: Path, extra: dict[str, str]) -> tuple[Run, Lines, Path, list[Any]]:
    state, where = tmp_path / "nvml.json", tmp_path / "pids"
    where.mkdir()
    devices = [device(0), device(1)]
    write_state(state, devices)
    env = {**fake_env(state), "GPU_PIDS_DIR": str(where), **extra}
    run = start(["--nproc-per-node", "2", rank_script("gpu_rank.py")], tmp_path, env=env)
    return run, Lines(run), where, devices


def test_devices_memory_a_move_and_the_peak(tmp_path: Path) -> None:
    run, lines, where, devices = gpu_run(tmp_path, {"GPU_EXIT_1": "7"})
    state = tmp_path / "nvml.json"
    try:
        (rank0, _), (_, rank1_child) = pids(where, 2)
        # rank 0 holds GPU 0 itself; rank 1's child (a descendant) holds GPU 1
        write_state(state, devices, [process(rank0, 0, 3 * GIB), process(rank1_child, 1, 5 * GIB)])
        lines.wait(r"gpu: gpu0 40% 2\.0/80\.0 GiB 60C 250 W \(rank 0 3\.0 GiB\); "
                   r"gpu1 .*\(rank 1 5\.0 GiB\)")
        write_state(state, devices, [process(rank0, 0, 4 * GIB), process(rank1_child, 0, 7 * GIB)])
        lines.wait(r"gpu0 .*\(rank 0 4\.0 GiB, rank 1 7\.0 GiB\); gpu1 40%")
        write_state(state, [device(0), device(1, utilization=93, temperature=None)],
                    [process(rank0, 0, 4 * GIB), process(rank1_child, 1, GIB)])
        lines.wait(r"gpu1 93% .*\(rank 1 1\.0 GiB\)")
        (where / "go").touch()
        assert run.wait(60) == 2
    finally:
        (where / "go").touch()
        run.wait(60)
    envelope = run.envelope()
    ranks = envelope["ranks"]
    assert ranks[0]["gpu"] == {"devices": [devices[0]["uuid"]], "peak_memory_bytes": 4 * GIB}
    assert ranks[1]["gpu"] == {"devices": [devices[1]["uuid"], devices[0]["uuid"]],
                               "peak_memory_bytes": 7 * GIB}
    cause = envelope["root_cause_gpu"]
    assert envelope["root_cause_rank"] == 1 and cause["rank"] == 1
    assert cause["memory_bytes"] == GIB
    (held,) = cause["devices"]
    assert (held["index"], held["uuid"], held["utilization_percent"]) == (1, devices[1]["uuid"],
                                                                          93.0)
    assert held["temperature_c"] is None and held["power_w"] == 250.0
    summary = lines.wait(r"gpu peak")
    assert summary.split()[-2:] == ["gpu", "peak"]
    assert lines.wait(r"^1 .* 1,0 +7\.0 GiB$")


def test_nproc_gpu_counts_the_fake_devices(tmp_path: Path) -> None:
    state = tmp_path / "nvml.json"
    write_state(state, [device(i) for i in range(3)])
    env = {**fake_env(state), "CUDA_VISIBLE_DEVICES": "2,0"}
    run = run_cli(["--nproc-per-node", "gpu", rank_script("exit_with.py"), "0"], tmp_path, env=env)
    assert run.proc.returncode == 0
    assert run.envelope()["nproc_per_node"] == 2


@pytest.mark.fault("F41")
def test_nproc_gpu_without_a_gpu_is_a_config_error(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "gpu", rank_script("exit_with.py"), "0"], tmp_path)
    _, err = run.output()
    assert run.proc.returncode == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("forgelm-tui: error: --nproc-per-node gpu: no GPU visible here "
                           "(NVML found none, or CUDA_VISIBLE_DEVICES hides them all) (exit 1")
    assert run.envelope()["error"].startswith("--nproc-per-node gpu")


def test_on_a_cpu_machine_no_gpu_is_mentioned(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "2", rank_script("exit_with.py"), "0"], tmp_path)
    out, err = run.output()
    assert run.proc.returncode == 0
    said = (out + err).replace(str(tmp_path), "TMP")  # the test's own name has "gpu" in it
    assert not re.search(r"gpu|nvml|cuda", said, re.IGNORECASE)
    envelope = run.envelope()
    assert envelope["root_cause_gpu"] is None
    assert all(rank["gpu"] is None for rank in envelope["ranks"])


def test_the_tui_shows_each_rank_on_its_device_and_a_move(term: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The real app in tmux (its server started with the fake NVML in its environment)."""
    state, where = tmp_path / "nvml.json", tmp_path / "pids"
    where.mkdir()
    devices = [device(0), device(1, utilization=70)]
    write_state(state, devices)
    env = fake_env(state)
    for key in ("PYTHONPATH", "FAKE_NVML_STATE"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("GPU_PIDS_DIR", str(where))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    term.start(["--nproc-per-node", "2", rank_script("gpu_rank.py")])
    try:
        (rank0, _), (_, rank1_child) = pids(where, 2)
        write_state(state, devices,
                    [process(rank0, 0, 30 * GIB), process(rank1_child, 1, 20 * GIB)])
        term.wait_screen(r"GPU mem")
        term.wait_screen(r"gpu0 40% 2\.0/80\.0 GiB 60C 250 W  ·  gpu1 70%")
        term.wait_screen(r"(?m)^\s*0 .* 0 +40\.0 +\S+ 30\.0/80\.0G")
        term.wait_screen(r"(?m)^\s*1 .* 1 +70\.0 +\S+ 20\.0/80\.0G")
        write_state(state, devices,
                    [process(rank0, 0, 30 * GIB), process(rank1_child, 0, 25 * GIB)])
        term.wait_screen(r"(?m)^\s*1 .* 0 +40\.0 +\S+ 25\.0/80\.0G")
    finally:
        (where / "go").touch()
    term.wait_screen(r"FINISHED.*exit 0")
    term.press("q")
    assert term.exit_code() == 0
    ranks = term.envelope()["ranks"]
    assert isinstance(ranks, list)
    assert ranks[1]["gpu"] == {"devices": [devices[1]["uuid"], devices[0]["uuid"]],
                               "peak_memory_bytes": 25 * GIB}
