"""Progress reaches the supervisor: from the channel, or from HF Trainer's own output."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import rank_script, run_cli

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.progress_lines import lines_with, parse_loss, parse_step

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("line", "step"),
    [(" 40%|####      | 2/5 [00:01<00:01, 1.9it/s]", (2, 5)),
     ("100%|██████████| 1200/1200 [00:41<00:00, 29.15it/s]", (1200, 1200)),
     ("Epoch 1: 3/10 [00:01]", None),
     ("no bar here", None)],
)
def test_parse_step(line: str, step: tuple[int, int] | None) -> None:
    assert parse_step(line) == step


@pytest.mark.parametrize(
    ("line", "loss"),
    [("{'loss': '3.9', 'grad_norm': '1.0'}", 3.9), ('{"loss": 0.25}', 0.25),
     ("{'eval_loss': 1.5}", None), ("loss is fine", None)],
)
def test_parse_loss(line: str, loss: float | None) -> None:
    assert parse_loss(line) == loss


def test_lines_with_gives_matching_lines_newest_first() -> None:
    raw = b"a/1\nplain\n\x1b[1mb/2\x1b[0m\nc\nd/3"
    assert list(lines_with(raw, b"/")) == ["d/3", "b/2", "a/1"]
    assert list(lines_with(raw, b"loss")) == []
    assert next(lines_with(b"only/line", b"/")) == "only/line"
    raw = b" 40%|####  | 2/5 [00:01]\n/usr/lib/x\nhttp://a/b"
    assert list(lines_with(raw, b"/", b"[", b"|")) == [" 40%|####  | 2/5 [00:01]"]


def test_an_output_event_sanitises_only_what_is_asked() -> None:
    out = ev.RankOutput(3, "stdout", b"one\n\x1b[31mtwo\x1b[0m\n\nfour")
    assert out.count == 4
    assert out.tail(2) == ("", "four")
    assert out.last_line == "four"
    assert "lines" not in out.__dict__  # nothing else decoded yet
    assert out.lines == ("one", "two", "", "four")
    assert out.tail(3) == ("two", "", "four")
    assert out.tail(9) == out.lines
    assert ev.RankOutput.of(0, "stderr", ["x", ""]) == ev.RankOutput(0, "stderr", b"x\n")
    assert ev.RankOutput.of(0, "stdout", ["a\nb"]).count == 2
    with pytest.raises(ValueError):
        ev.RankOutput.of(0, "stdout", [])


def test_progress_from_hf_style_output(tmp_path: Path) -> None:
    run = run_cli([rank_script("progress_bar.py")], tmp_path)
    assert run.proc.returncode == 0
    rank = run.envelope()["ranks"][0]
    assert rank["progress"] == {"step": 20, "total": 20, "metrics": {"loss": 1.0},
                                "source": "output"}
    # The loss dicts' values, at the step the bar showed then (the two pipes are read apart:
    # a step or so either way); a chunk holding two dicts gives its newest.
    points = rank["metrics_history"]["loss"]
    assert points[-1][1] == 1.0 and 1 <= len(points) <= 4
    assert [v for _, v in points] == sorted((v for _, v in points), reverse=True)


def test_progress_from_the_channel(tmp_path: Path, marks: Path) -> None:
    """forgelm_tui.rank.report_progress from torch-free ranks (steps 1..8 of 100, a loss each):
    the channel is the rank helpers', not the demo's (the demo reports through it too)."""
    run = run_cli(["--nproc-per-node", "2", rank_script("evidence.py"), "pause", str(marks),
                   "0"], tmp_path, timeout=60)
    assert run.proc.returncode == 0
    for rank in run.envelope()["ranks"]:
        assert rank["progress"]["source"] == "channel"
        assert (rank["progress"]["step"], rank["progress"]["total"]) == (8, 100)
        assert rank["progress"]["metrics"] == {"loss": 1.0 / 8}
        history = rank["metrics_history"]["loss"]
        assert [step for step, _ in history] == list(range(1, 9))
        assert history[-1][1] == rank["progress"]["metrics"]["loss"]


def test_heartbeats_keep_a_silent_run_from_stalling(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "2", "--stall-timeout", "1.5",
                   rank_script("heartbeat_only.py"), "3"], tmp_path)
    assert run.proc.returncode == 0
    assert run.envelope()["stop"] is None
