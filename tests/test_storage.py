"""Storage faults: a full or unwritable run dir never crashes the supervisor or blocks the ranks;
what was not kept is said in one line and in the envelope; the closing line names only files
that exist; the code stays the ranks' own (docs/security.md, "Storage faults")."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, make_plan, rank_script, ready_pids, start

from forgelm_tui.engine import events as ev
from forgelm_tui.engine import output
from forgelm_tui.engine.logfile import RETRY_EVERY, LogFile, LogLoss
from forgelm_tui.envelope.storage import not_kept_line, section
from forgelm_tui.envelope.write import write_each
from forgelm_tui.session.run import Session

pytestmark = pytest.mark.timeout(90)
ROOT = os.geteuid() == 0


# ------------------------------------------------------------------ the writer, in-process


class FakeDisk:
    """A write function that takes ``room`` bytes, then fails with ``error``."""

    def __init__(self, room: int, error: int = errno.ENOSPC) -> None:
        self.room = room
        self.error = error
        self.kept = bytearray()
        self.calls = 0

    def __call__(self, fd: int, data: memoryview) -> int:
        self.calls += 1
        if self.room <= 0:
            raise OSError(self.error, os.strerror(self.error))
        count = min(len(data), self.room)
        self.kept += data[:count]
        self.room -= count
        return count


def _log(disk: FakeDisk, clock: FakeClock, told: list[LogLoss]) -> LogFile:
    return LogFile(-1, 1, "stdout", "/runs/x/rank-1.stdout.log", on_loss=told.append,
                   write=disk, clock=clock, wall=lambda: 1_700_000_000.0 + clock.now)


@pytest.mark.fault("F29")
def test_a_full_disk_counts_what_it_lost_and_never_raises() -> None:
    disk, clock, told = FakeDisk(room=150), FakeClock(), []
    log = _log(disk, clock, told)
    assert log.write(b"a" * 100) == 100
    assert log.write(b"b" * 100) == 50  # a short write, then ENOSPC on the rest
    assert len(told) == 1 and told[0] is log.loss
    loss = log.loss
    assert loss is not None
    assert loss.error.startswith("ENOSPC: ") and loss.bytes_lost == 50 and loss.failures == 1
    assert loss.since == 1_700_000_100.0 and loss.resumed_at is None
    calls = disk.calls
    for _ in range(10):  # inside the retry window: counted, not even tried
        assert log.write(b"c" * 10) == 0
    assert disk.calls == calls and loss.bytes_lost == 150
    clock.now += RETRY_EVERY  # tried again: still full
    assert log.write(b"d" * 10) == 0
    assert disk.calls == calls + 1 and loss.failures == 2 and loss.bytes_lost == 160
    disk.room = 1000  # space came back
    clock.now += RETRY_EVERY
    assert log.write(b"e" * 20) == 20
    assert loss.resumed_at == 1_700_000_000.0 + clock.now and not log.failing
    assert bytes(disk.kept) == b"a" * 100 + b"b" * 50 + b"e" * 20
    assert len(told) == 1  # views are told once a stream


@pytest.mark.fault("F30")
@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.EIO, errno.EDQUOT])
def test_every_write_error_is_a_loss_not_a_crash(code: int) -> None:
    disk, clock, told = FakeDisk(room=0, error=code), FakeClock(), []
    log = _log(disk, clock, told)
    assert log.write(b"x" * 64) == 0
    assert log.loss is not None and log.loss.bytes_lost == 64
    assert log.loss.error.startswith(errno.errorcode[code])


def test_a_write_that_makes_no_progress_is_a_failure() -> None:
    told: list[LogLoss] = []
    log = LogFile(-1, 0, "stderr", "p", on_loss=told.append, write=lambda fd, data: 0)
    assert log.write(b"abc") == 0
    assert told and told[0].bytes_lost == 3


def test_not_kept_line_names_rank_stream_bytes_and_time() -> None:
    envelope = {"storage": {"error": "ENOSPC: No space left on device",
                            "since": "2026-01-02T03:04:05.678Z",
                            "ranks": [{"rank": 0, "stream": "stdout", "bytes_lost": 2_097_152,
                                       "since": "2026-01-02T03:04:05.678Z"},
                                      {"rank": 1, "stream": "stderr", "bytes_lost": 12,
                                       "since": "2026-01-02T03:04:06.000Z"}]}}
    line = not_kept_line(envelope)
    assert line == ("not kept on disk (ENOSPC: No space left on device): rank 0 stdout "
                    "2.0 MiB (2097152 bytes) from 03:04:05.678Z; rank 1 stderr 12 bytes from "
                    "03:04:06.000Z")
    assert not_kept_line({"storage": None}) is None


# ------------------------------------------------------------------ the envelope's places


@pytest.mark.fault("F31")
def test_an_envelope_place_that_fails_never_stops_the_others(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    good = tmp_path / "out" / "envelope.json"
    built: list[Any] = []

    def envelope_for(failed: Any) -> dict[str, Any]:
        built.append(list(failed))
        return {"exit_code": 3, "storage": section((), failed)}

    shown, written, errors = write_each([blocked / "envelope.json", good], envelope_for)
    assert written == [str(good)] and len(errors) == 1 and str(blocked) in errors[0]
    kept = json.loads(good.read_text())
    assert kept["storage"]["envelope_not_written"][0]["path"] == str(blocked / "envelope.json")
    assert shown == kept  # ...and so does the printed one
    assert built[0] == [] and built[1][0]["path"] == str(blocked / "envelope.json")
    assert section((), ()) is None  # every place took it: nothing to say


# ------------------------------------------------------------------ in-process, any user


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every rank log takes 4 KiB, then fails with ENOSPC (the other files are real)."""

    def log_file(fd: int, rank: int, stream: str, path: str, **kw: Any) -> LogFile:
        disk = FakeDisk(room=4096)
        return LogFile(fd, rank, stream, path, write=partial(_real_write, disk), **kw)

    monkeypatch.setattr(output, "LogFile", log_file)
    yield


def _real_write(disk: FakeDisk, fd: int, data: memoryview) -> int:
    count = disk(fd, data)
    return os.write(fd, data[:count])


@pytest.mark.fault("F29")
def test_ranks_drain_and_views_get_every_line_when_the_logs_fail(tmp_path: Path,
                                                                 full_disk: None) -> None:
    lines = 20_000
    argv = [sys.executable, rank_script("flood.py"), str(lines), "3"]
    session = Session(make_plan(tmp_path, argv, 2))
    shown = {0: 0, 1: 0}
    told: list[ev.LogNotKept] = []

    def view(event: ev.Event) -> None:
        if isinstance(event, ev.RankOutput) and event.stream is ev.Stream.STDOUT:
            shown[event.rank] += len(event.lines)
        elif isinstance(event, ev.LogNotKept):
            told.append(event)

    session.subscribe(view)
    ending = asyncio.run(session.run())
    assert ending.verdict.code == 3  # the ranks' own code
    assert shown == {0: lines, 1: lines}  # nothing blocked, nothing lost on the way to views
    assert sorted(e.rank for e in told) == [0, 1] and all(e.stream is ev.Stream.STDOUT
                                                          for e in told)
    storage = ending.envelope["storage"]
    assert storage["error"].startswith("ENOSPC")
    total = {r["rank"]: r["bytes_lost"] for r in storage["ranks"]}
    for record in ending.envelope["ranks"]:
        on_disk = Path(record["stdout_log"]).stat().st_size
        assert on_disk == 4096 and on_disk + total[record["rank"]] == record["stdout_bytes"]
    assert ending.envelope_paths == (str(tmp_path / "run" / "envelope.json"),)


# ------------------------------------------------------------------ real file systems (root)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if not ROOT:
        pytest.skip("needs root to mount a 512 KiB tmpfs (CI runs as root)")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _named_files(text: str) -> list[str]:
    """Every path the closing line names after ``envelope:``."""
    closing = [line for line in text.splitlines() if " exit " in line and "envelope:" in line]
    assert closing, text[-2000:]
    named = closing[-1].split("envelope: ", 1)[1].split(", ")
    return [n for n in named if n not in ("stdout", "not written")]


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err and "OSError" not in err, err[-3000:]


@pytest.mark.fault("F29")
def test_run_dir_on_a_full_tmpfs(tmp_path: Path, small_tmpfs: Path) -> None:
    extra = tmp_path / "elsewhere" / "envelope.json"
    run_dir = small_tmpfs / "run"
    run = start(["--run-dir", str(run_dir), "--output-format", "json", "--envelope", str(extra),
                 "--nproc-per-node", "2", rank_script("flood.py"), "30000", "4"], tmp_path)
    out, err = run.proc.communicate(timeout=80)
    assert run.proc.returncode == 4, err[-3000:]  # the ranks' own code
    _no_traceback(err)
    lost = [line for line in err.splitlines() if "not kept on disk" in line]
    assert len(lost) == 1 and "rank 0 stdout" in lost[0] and "rank 1 stdout" in lost[0]
    envelope = json.loads(out)  # the envelope, and only the envelope, on stdout
    assert envelope["exit_code"] == 4
    storage = envelope["storage"]
    assert storage["error"].startswith("ENOSPC")
    assert {r["rank"] for r in storage["ranks"]} == {0, 1}
    assert all(r["bytes_lost"] > 0 for r in storage["ranks"])
    named = _named_files(err)
    assert str(extra) in named
    for path in named:
        assert Path(path).is_file(), f"the closing line names {path}, which does not exist"
    assert json.loads(extra.read_text())["exit_code"] == 4
    if not (run_dir / "envelope.json").exists():
        assert str(run_dir / "envelope.json") not in named
        assert any(str(run_dir / "envelope.json") in line for line in err.splitlines())


@pytest.mark.fault("F30")
def test_run_dir_turned_read_only_mid_run(tmp_path: Path, marks: Path) -> None:
    if not ROOT:
        pytest.skip("needs root to remount the run dir read-only (CI runs as root)")
    run_dir = tmp_path / "run"
    extra = tmp_path / "kept" / "envelope.json"
    run = start(["--envelope", str(extra), "--nproc-per-node", "2",
                 rank_script("wait_then_flood.py"), str(marks), "2000", "3"], tmp_path)
    mounted = False
    try:
        ready_pids(marks, 2)
        # A read-only bind mount over the run dir: files already open (the logs) keep
        # working through the old mount; anything new there (the envelope) gets EROFS.
        mounted = _sh(["mount", "--bind", str(run_dir), str(run_dir)])
        if not mounted or not _sh(["mount", "-o", "remount,bind,ro", str(run_dir)]):
            pytest.skip("cannot make a read-only bind mount here")
        (marks / "go").write_text("")
        out, err = run.proc.communicate(timeout=60)
    finally:
        if run.proc.poll() is None:
            (marks / "go").write_text("")
            run.proc.kill()
        if mounted:
            subprocess.run(["umount", "-l", str(run_dir)], check=False)
    assert run.proc.returncode == 3, err[-3000:]
    _no_traceback(err)
    assert f"cannot write envelope {run_dir / 'envelope.json'}" in out
    named = _named_files(out)
    assert named == [str(extra)]
    envelope = json.loads(extra.read_text())
    assert envelope["exit_code"] == 3
    assert envelope["storage"]["envelope_not_written"][0]["path"] == str(run_dir / "envelope.json")
    assert envelope["storage"]["envelope_not_written"][0]["error"].startswith("EROFS")


def _sh(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True).returncode == 0



@pytest.mark.fault("F29")
def test_tui_on_a_full_tmpfs_says_what_was_lost(tmp_path: Path, small_tmpfs: Path,
                                                 term: Any) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("no tmux")
    shutil.copy(rank_script("wait_then_flood.py"), tmp_path / "r.py")
    (tmp_path / "m").mkdir()
    run_dir = small_tmpfs / "run"
    term.start(["--tui", "--run-dir", str(run_dir), "--envelope", "out/e.json",
                "--nproc-per-node", "2", "r.py", "m", "20000", "3"], raw=True)
    term.wait_screen(r"RUNNING")
    (tmp_path / "m" / "go").write_text("")
    term.wait_screen(r"cannot write rank \d's stdout log")  # the live notice
    term.wait_screen(r"exit 3 EVAL_FAILURE")
    term.wait_screen(r"not kept on disk \(ENOSPC")  # the verdict panel
    term.press("q")
    assert term.exit_code() == 3
    after = term.wait_screen(r"forgelm-tui: exit 3").replace("\n", "")
    assert "Traceback" not in after
    assert "forgelm-tui: not kept on disk (ENOSPC" in after
    named = after.rsplit("; envelope: ", 1)[1].split(", ")
    assert str(tmp_path / "out" / "e.json") in [n.strip() for n in named]
    for path in named:
        assert Path(path.strip()).is_file(), f"{path!r} is named but does not exist"


@pytest.mark.fault("F39")
def test_a_run_dir_that_cannot_be_written_is_one_clear_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mounted = False
    if ROOT:  # root writes through modes: a read-only bind mount instead
        mounted = _sh(["mount", "--bind", str(run_dir), str(run_dir)]) and \
            _sh(["mount", "-o", "remount,bind,ro", str(run_dir)])
        if not mounted:
            subprocess.run(["umount", "-l", str(run_dir)], check=False)
            pytest.skip("cannot make a read-only bind mount here")
    else:
        run_dir.chmod(0o500)
    extra = tmp_path / "e.json"
    try:
        run = start(["--run-dir", str(run_dir), "--envelope", str(extra),
                     rank_script("exit_with.py"), "0"], tmp_path)
        _, err = run.proc.communicate(timeout=60)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(run_dir)], check=False)
        run_dir.chmod(0o700)
    assert run.proc.returncode == 1
    _no_traceback(err)
    assert f"--run-dir {run_dir}: not writable" in err
    assert f"envelope: {extra})" in err
    assert json.loads(extra.read_text())["error"] == f"--run-dir {run_dir}: not writable"


@pytest.mark.fault("F31")
def test_an_ending_names_only_files_written(tmp_path: Path) -> None:
    from forgelm_tui.session.ending import RunEnding
    from forgelm_tui.verdict import prelaunch_failure

    nowhere = RunEnding(prelaunch_failure(), {"exit_code": 1}, None)
    assert nowhere.where_line() == "; envelope: not written"
    assert nowhere.where_line(on_stdout=True) == "; envelope: stdout"
    assert json.loads(nowhere.envelope_text()) == {"exit_code": 1}  # the TUI's s still saves
    both = RunEnding(prelaunch_failure(), {}, "/a/envelope.json", (),
                     ("/a/envelope.json", "/b/e.json"))
    assert both.where_line() == "; envelope: /a/envelope.json, /b/e.json"


def test_a_multi_node_envelope_has_every_nodes_losses() -> None:
    from forgelm_tui.envelope.storage import section as merged

    def section(rank: int, since: str) -> dict[str, Any]:
        loss = {"rank": rank, "stream": "stdout", "bytes_lost": 10, "since": since,
                "error": f"E{rank}"}
        return {"error": f"E{rank}", "since": since, "ranks": [loss],
                "envelope_not_written": []}

    both = merged([section(3, "2026-01-01T00:00:02.000Z"), None,
                   section(1, "2026-01-01T00:00:01.000Z")])
    assert both is not None and both["error"] == "E1"
    assert [r["rank"] for r in both["ranks"]] == [1, 3]
    assert merged([None, None]) is None
