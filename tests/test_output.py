"""Output: every line reaches the log files, a closed stdout changes nothing, JSON is clean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import make_plan, rank_script, run_cli, start, wait_for

pytestmark = pytest.mark.timeout(120)

LINES = 40_000  # 4 MB a rank: four times what its pipe holds (1 MiB), 8 ranks' 32 MB in all


def _check_logs(run_dir: Path, ranks: int, lines: int) -> None:
    for rank in range(ranks):
        log = (run_dir / f"rank-{rank}.stdout.log").read_bytes().split(b"\n")
        assert log[-1] == b""
        assert len(log) - 1 == lines, f"rank {rank} lost lines"
        assert log[0].startswith(b"r%03d line 000000000" % rank)
        assert log[-2].startswith(b"r%03d line %09d" % (rank, lines - 1))


@pytest.mark.fault("F17")
def test_flood_of_8_ranks_loses_no_line(tmp_path: Path) -> None:
    run = start(["--nproc-per-node", "8", rank_script("flood.py"), str(LINES)], tmp_path)
    out, _ = run.proc.communicate(timeout=110)
    assert run.proc.returncode == 0
    _check_logs(run.run_dir, 8, LINES)
    shown = [line for line in out.splitlines() if line.startswith("[rank ")]
    dropped = sum(
        int(line.split()[1]) for line in out.splitlines() if "lines not shown here" in line
    )
    assert len(shown) + dropped == 8 * LINES


@pytest.mark.fault("F17")
def test_unread_stdout_never_blocks_the_ranks(tmp_path: Path) -> None:
    # Nobody reads the supervisor's stdout: the ranks still run to the end at their own pace.
    run = start(["--nproc-per-node", "2", rank_script("flood.py"), str(LINES), "3"], tmp_path)

    def logs_complete() -> bool:
        try:
            _check_logs(run.run_dir, 2, LINES)
        except (AssertionError, FileNotFoundError, IndexError):
            return False
        return True

    wait_for(logs_complete, 60, "the ranks to finish while stdout is unread", step=0.2)
    wait_for(lambda: (run.run_dir / "envelope.json").exists(), 30, "the envelope")
    out, _ = run.proc.communicate(timeout=60)
    assert run.proc.returncode == 3
    assert out.rstrip().splitlines()[-1].startswith("[forgelm-tui] exit 3 EXIT_EVAL_FAILURE")


@pytest.mark.fault("F28")
def test_closed_stdout_never_changes_the_code(tmp_path: Path) -> None:
    run = start(["--nproc-per-node", "2", rank_script("flood.py"), "20000", "3"], tmp_path)
    assert run.proc.stdout is not None
    first = run.proc.stdout.readline()
    run.proc.stdout.close()  # as `| head -1` does
    assert first.startswith("[forgelm-tui]")
    assert run.wait(60) == 3
    assert run.envelope()["exit_code"] == 3
    _, err = run.proc.communicate()
    assert "Traceback" not in err
    assert "BrokenPipe" not in err
    _check_logs(run.run_dir, 2, 20000)


def test_json_output_is_only_the_envelope(tmp_path: Path) -> None:
    run = run_cli(["--output-format", "json", "--nproc-per-node", "2",
                   rank_script("exit_with.py"), "4"], tmp_path)
    out, err = run.output()
    assert run.proc.returncode == 4
    assert json.loads(out) == run.envelope()
    assert "[rank 0] rank 0 of 2 says hello" in err


@pytest.mark.fault("F15")
def test_hostile_output_is_plain_text(tmp_path: Path) -> None:
    run = run_cli([rank_script("hostile_output.py")], tmp_path)
    out, _ = run.output()
    lines = [line.removeprefix("[rank 0] ") for line in out.splitlines()
             if line.startswith("[rank 0] ")]
    assert lines == ["red plain", "progress 100%", "[bold]not bold[/] [rank0] [/]", "osc gone",
                     "tab here" + "nul"]
    assert "\x1b" not in out
    raw = (run.run_dir / "rank-0.stdout.log").read_bytes()
    assert b"\x1b[31m" in raw, "the log file keeps the bytes as the rank wrote them"


@pytest.mark.fault("F28")
def test_shell_pipe_to_head(tmp_path: Path) -> None:
    script = rank_script("exit_with.py")
    proc = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$@" | head -1; echo "code=${PIPESTATUS[0]}"', "bash",
         sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir", str(tmp_path / "run"),
         "--nproc-per-node", "2", script, "4"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert proc.stdout.splitlines()[-1] == "code=4"
    assert "Traceback" not in proc.stderr


def test_output_pipes_have_room_for_a_ui_frame(tmp_path: Path) -> None:
    """A rank printing fast keeps running while the supervisor draws: its pipes hold 1 MiB
    with a few ranks, less with many, never more than the budget in all."""
    from forgelm_tui.engine.spawn import PIPE_BUDGET, PIPE_DEFAULT, PIPE_MAX, pipe_capacity

    assert pipe_capacity(2) == PIPE_MAX
    assert pipe_capacity(64) * 2 * 64 <= PIPE_BUDGET
    assert pipe_capacity(100_000) == PIPE_DEFAULT
    run = run_cli(["--nproc-per-node", "2", rank_script("pipe_size.py")], tmp_path)
    assert run.proc.returncode == 0
    for rank in range(2):
        line = (run.run_dir / f"rank-{rank}.stdout.log").read_text().strip()
        assert line == f"pipe sizes {PIPE_MAX} {PIPE_MAX}", line


def test_headless_lines_for_engine_events() -> None:
    """--no-tui's notices, from events alone (what the real runs above print as they happen)."""
    import os

    from forgelm_tui.engine import events as ev
    from forgelm_tui.engine.events import Purpose, RankState
    from forgelm_tui.headless.view import HeadlessView, OutputSink
    from forgelm_tui.verdict import StopKind

    read_fd, write_fd = os.pipe()
    sink = OutputSink(write_fd)
    view = HeadlessView(sink)
    for event in (ev.RankSampled(1, {"cpu": 0.0, "rss": 1 << 20, "children": 0}, 12.4),
                  ev.RankStateChanged(1, RankState.QUIET),
                  ev.RankSignalled(0, 40, Purpose.FORWARD, "SIGRTMIN+6 forwarded", 1.0),
                  ev.RunStopping(StopKind.FORWARDED, "rank 0 ended on SIGUSR1", "forwarded signal",
                                 30.0, (1,), 2.0),
                  ev.RankExited(0, None, 40, False, 3.0),
                  ev.RankReportedStop(1, "SIGTERM", True, 7)):
        view(event)
    sink.close()
    os.close(write_fd)
    with os.fdopen(read_fd) as handle:
        text = handle.read()
    assert "rank 1 is quiet (no output for 12 s, no CPU use)" in text
    assert "rank 0 <- SIGRTMIN+6 (forward: SIGRTMIN+6 forwarded)" in text
    assert "stopping: rank 0 ended on SIGUSR1; SIGTERM sent to rank(s) 1, SIGKILL in 30 s" in text
    assert "rank 0 killed by SIGRTMIN+6" in text
    assert "rank 1 reported SIGTERM from outside forgelm-tui (stopped at step 7)" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("loop", ["exits first", "kernel order"])
def test_a_ranks_last_words_come_before_its_exit_whatever_the_loop(tmp_path: Path,
                                                                    loop: str) -> None:
    """The run's loop takes a rank's pidfd before its pipes (engine/loop.py) and the exit
    handler reads what the rank left in them: views still see every last line, the one with
    no newline too, before the rank's exit, and the stop it caused after; a plain loop, which
    keeps the kernel's order, gives the same events."""
    import asyncio

    from forgelm_tui.engine import events as ev
    from forgelm_tui.engine.loop import new_loop
    from forgelm_tui.session.run import Session

    session = Session(make_plan(tmp_path, [sys.executable, rank_script("last_words.py")], 2))
    seen: list[ev.Event] = []
    session.subscribe(seen.append)
    factory = new_loop if loop == "exits first" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        ending = runner.run(session.run())
    assert ending.verdict.code == 2 and ending.verdict.deciding_rank == 1
    order = [e for e in seen if getattr(e, "rank", None) == 1
             and isinstance(e, (ev.RankOutput, ev.RankExited))]
    exited = next(i for i, e in enumerate(order) if isinstance(e, ev.RankExited))
    assert exited == len(order) - 1, "output of rank 1 after its exit"
    lines = [line for e in order[:exited] if isinstance(e, ev.RankOutput)
             for line in e.lines]
    assert lines.count("ValueError: the end") == 1
    assert sum(1 for line in lines if line.endswith("of the last words")) == 2000
    assert "no newline at the very end" in lines
    stops = [i for i, e in enumerate(seen) if isinstance(e, ev.RunStopping)]
    assert stops and stops[0] > seen.index(order[exited])
    log = (session.plan.spec.run_dir / "rank-1.stdout.log").read_bytes()
    assert log.endswith(b"no newline at the very end") and log.count(b"\n") == 2000


def _headless_text(events: list[Any], output_ranks: frozenset[int] | None = None) -> str:
    import os

    from forgelm_tui.headless.view import HeadlessView, OutputSink

    read_fd, write_fd = os.pipe()
    sink = OutputSink(write_fd)
    view = HeadlessView(sink, output_ranks)
    for event in events:
        view(event)
    sink.close()
    os.close(write_fd)
    with os.fdopen(read_fd) as handle:
        return handle.read()


def _node_of(world: int, per_node: int, node: int) -> list[Any]:
    """Node ``node`` of a run: its ranks start, print a line each, rank 1 of it fails."""
    from forgelm_tui.engine import events as ev
    from forgelm_tui.engine.events import Stream

    first = node * per_node
    events: list[Any] = [ev.RunStarted("r", world, ("x",), "/runs/x", 0.0, node,
                                       world // per_node)]
    for local in range(per_node):
        events.append(ev.RankStarted(first + local, local, 100 + local, 0.0))
    for local in range(per_node):
        events.append(ev.RankOutput.of(first + local, Stream.STDOUT, (f"hello {local}",)))
    events.append(ev.RankExited(first + 1, 2, None, False, 1.0))
    return events


@pytest.mark.parametrize(("world", "output_ranks", "printed"), [
    (16, None, {0, 1, 2, 3}),  # a small run: every rank's output
    (64, None, {0, 1, 2, 3}),  # at the threshold still
    (68, None, {0}),  # beyond it: local rank 0's on each node
    (68, frozenset({1, 3}), {1, 3}),  # the filter chosen wins
    (16, frozenset({2}), {2}),
], ids=["small", "at-threshold", "beyond", "beyond-filtered", "filtered"])
def test_headless_output_lines_of_the_filtered_local_ranks_state_lines_of_every_rank(
        world: int, output_ranks: frozenset[int] | None, printed: set[int]) -> None:
    """--local-ranks-filter (torchrun's, applied to output only) and the threshold rule."""
    per_node, node = 4, 2
    text = _headless_text(_node_of(world, per_node, node), output_ranks)
    first = per_node * node
    for local in range(per_node):
        assert f"rank {first + local} started (pid {100 + local})" in text
        assert (f"[rank {first + local}] hello {local}" in text) is (local in printed), text
    assert f"rank {first + 1} exited with 2" in text  # its failure, filtered or not
    told = "only on each node" in text
    assert told is (printed != {0, 1, 2, 3}), text


@pytest.mark.timeout(60)
def test_local_ranks_filter_on_a_real_run(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "3", "--local-ranks-filter", "0,2",
                   rank_script("exit_with.py"), "0"], tmp_path)
    out, _ = run.output()
    assert run.proc.returncode == 0, out
    for rank in (0, 2):
        assert f"[rank {rank}] rank {rank} of 3 says hello" in out
        assert f"[rank {rank}] rank {rank} exiting with 0" in out
    assert "[rank 1]" not in out
    assert "rank 1 started" in out and "rank 1 exited with 0" in out  # its state lines print
    assert "output lines of local rank(s) 0,2 only on each node (--local-ranks-filter)" in out
    log = (run.run_dir / "rank-1.stdout.log").read_text()
    assert "rank 1 of 3 says hello" in log and "rank 1 exiting with 0" in log


def test_the_output_filter_is_told_once_whatever_the_attempts() -> None:
    """A restart's attempt starts the run again: its RunStarted says nothing new."""
    events = _node_of(128, 4, 0)
    text = _headless_text(events + events[:1])
    assert text.count("only on each node") == 1
    assert "(128 ranks (more than 64))" in text
