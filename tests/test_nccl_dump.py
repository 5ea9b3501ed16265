"""NCCL's flight-recorder dumps (engine/nccl_dump.py): the variables the ranks get, the pipe
poked without ever blocking, and only a dump written since the rank started listed. The real
pipe is torch's (ProcessGroupNCCL, GPU only): tests/test_hang.py drives the whole path with a
rank that plays it, bench/gpu_hang_check.py checks it on a GPU machine."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from forgelm_tui.engine import nccl_dump
from forgelm_tui.engine.spec import DUMP_VARS, PIPE_VAR, LaunchSpec, rank_env
from forgelm_tui.rank.collectives import COLLECTIVES_ENV

pytestmark = pytest.mark.timeout(30)


def spec(tmp_path: Path, trace: bool, style: str = "torchrun") -> LaunchSpec:
    return LaunchSpec(argv=("python", "x.py"), run_id="r", run_dir=tmp_path, nproc_per_node=2,
                      master_addr="127.0.0.1", master_port=1, env_style=style,
                      extra_env={COLLECTIVES_ENV: "1"} if trace else {})


@pytest.mark.parametrize("style", ["torchrun", "deepspeed"])
def test_with_the_trace_each_rank_dumps_into_its_run_dir(tmp_path: Path, style: str) -> None:
    env = rank_env(spec(tmp_path, True, style), 0, {})
    assert env[PIPE_VAR] == str(tmp_path / "nccl-pipe-rank-")
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "nccl-trace-rank-")
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env


def test_no_pipe_where_no_fifo_can_be_made(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """torch makes the pipe with a check that, failing in its monitor thread, would abort the
    rank: a run dir without FIFOs (a FUSE mount of an object store: EPERM) gets none; the
    dump file still goes there."""
    import forgelm_tui.engine.spec as spec_module

    def refuse(path: object, mode: int = 0o666) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(spec_module.os, "mkfifo", refuse)
    spec_module.fifos_work.cache_clear()
    try:
        env = rank_env(spec(tmp_path, True), 0, {})
        assert PIPE_VAR not in env
        assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "nccl-trace-rank-")
    finally:
        monkeypatch.undo()
        spec_module.fifos_work.cache_clear()
    assert spec_module.fifos_work(tmp_path) and not list(tmp_path.iterdir())  # probe removed
    assert not spec_module.fifos_work(tmp_path / "missing")


def test_without_the_trace_or_for_one_process_nothing_is_set(tmp_path: Path) -> None:
    for env in (rank_env(spec(tmp_path, False), 0, {}),
                rank_env(spec(tmp_path, True, "single"), 0, {})):
        assert PIPE_VAR not in env and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env


@pytest.mark.parametrize("own", [{"TORCH_FR_DUMP_TEMP_FILE": "/data/fr_"},
                                 {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/data/fr_"}])
def test_the_users_own_places_win(tmp_path: Path, own: dict[str, str]) -> None:
    base = {**own, PIPE_VAR: "/data/pipe_"}
    env = rank_env(spec(tmp_path, True), 0, base)
    assert env[PIPE_VAR] == "/data/pipe_"
    assert {k: env.get(k) for k in DUMP_VARS} == {
        k: own.get(k) for k in DUMP_VARS}
    assert nccl_dump.places(env) == ("/data/pipe_", "/data/fr_")


def test_nothing_looked_for_when_no_place_was_given() -> None:
    assert nccl_dump.places({}) == (None, None)  # torch's own place is every job's
    assert nccl_dump.request(None, 3) is False and nccl_dump.dump_file(None, 3, None) is None


def test_a_pipe_that_is_missing_unread_or_no_pipe_is_left_alone(tmp_path: Path) -> None:
    stem = str(tmp_path / "p-")
    assert nccl_dump.request(stem, 3) is False  # no pipe: no NCCL on this rank
    pipe = tmp_path / "p-3.pipe"
    os.mkfifo(pipe)
    began = time.monotonic()
    assert nccl_dump.request(stem, 3) is False  # a FIFO nobody reads (ENXIO): never blocks
    assert time.monotonic() - began < 1.0
    pipe.unlink()
    pipe.write_text("abc")
    assert nccl_dump.request(stem, 3) is False  # a plain file is no pipe of torch's
    assert pipe.read_text() == "abc"


def test_a_read_pipe_gets_its_byte(tmp_path: Path) -> None:
    stem = str(tmp_path / "p-")
    pipe = tmp_path / "p-3.pipe"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # as torch's DumpPipe opens it
    try:
        assert nccl_dump.request(stem, 3) is True
        assert os.read(fd, 128) == b"1"
    finally:
        os.close(fd)


def test_only_a_dump_written_since_the_rank_started_is_listed(tmp_path: Path) -> None:
    started, stem = time.time(), str(tmp_path / "t-")
    dump = tmp_path / "t-3"
    assert nccl_dump.dump_file(stem, 3, started) is None
    dump.write_bytes(b"")
    assert nccl_dump.dump_file(stem, 3, started) is None  # empty: torch has not written it yet
    dump.write_bytes(b"x")
    assert nccl_dump.dump_file(stem, 3, started) == str(dump)
    os.utime(dump, (started - 3600, started - 3600))
    assert nccl_dump.dump_file(stem, 3, started) is None  # an older run's
    assert nccl_dump.dump_file(None, 3, started) is None


async def test_the_capture_waits_for_a_dump_until_it_stops_growing(tmp_path: Path) -> None:
    """As torch's thread writes it: the wait ends once the file is there and settled, or at
    the deadline for one that never comes."""
    stem, since = str(tmp_path / "t-"), time.time()

    async def write() -> None:
        await asyncio.sleep(0.2)
        with open(f"{stem}0", "wb") as out:
            for _ in range(3):
                out.write(b"x" * 1000)
                out.flush()
                await asyncio.sleep(0.03)

    began = time.monotonic()
    writer = asyncio.ensure_future(write())
    await nccl_dump.written([(stem, 0)], since, began + 10)
    assert 0.2 <= time.monotonic() - began < 5 and writer.done()
    assert os.path.getsize(f"{stem}0") == 3000
    began = time.monotonic()
    await nccl_dump.written([(stem, 1)], since, began + 0.3)  # never written: the deadline
    assert 0.3 <= time.monotonic() - began < 2


def test_the_pipe_is_poked_from_any_thread_while_the_reader_polls(tmp_path: Path) -> None:
    """The reader polls as torch's monitor thread does; the byte waits in the pipe."""
    stem = str(tmp_path / "p-")
    pipe = tmp_path / "p-3.pipe"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    got: list[bytes] = []
    done = threading.Event()

    def poll() -> None:
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            try:
                if data := os.read(fd, 128):
                    got.append(data)
            except BlockingIOError:
                pass
            time.sleep(0.05)
        done.set()

    threading.Thread(target=poll, daemon=True).start()
    try:
        assert nccl_dump.request(stem, 3) is True
        assert done.wait(15)
        assert got == [b"1"]
    finally:
        os.close(fd)
