"""What a stop together looks like in the envelope and in the ranks' done files, for every
training library's rank program (tests/ranks/lightning_job.py, tests/ranks/hf_job.py): each rank
writes MARKS/done-RANK (JSON) when its ``fit`` / ``train`` returns."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any


def read_done(marks: Path, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((marks / f"done-{rank}").read_text())
    return data


def assert_interrupted_from_outside(envelope: dict[str, Any], first: int,
                                    signalled: set[int]) -> None:
    """Exit 2 by rule 4: the ranks in ``signalled`` got a SIGTERM from outside the supervisor,
    ``first`` before the others; every rank exited 0 and the supervisor signalled nobody."""
    assert envelope["exit_code"] == 2, envelope["decided_by"]
    assert envelope["exit_name"] == "EXIT_TRAINING_ERROR"
    assert envelope["decided_by"]["rule"] == 4, (envelope["decided_by"], [
        (r["rank"], r["exit_code"], r["signal"], r["stderr_tail"]) for r in envelope["ranks"]])
    assert envelope["decided_by"]["rank"] == first
    assert f"rank {first} stopped on a signal from outside" in envelope["decided_by"][
        "explanation"]
    assert envelope["outside_signal"] == {"rank": first, "signal": "SIGTERM",
                                          "ranks": sorted(signalled)}
    assert envelope["stop"] is None and envelope["cancelled"] is None
    for record in envelope["ranks"]:
        outside = record["rank"] in signalled
        assert record["exit_code"] == 0 and record["signal"] is None, record
        assert record["signalled_by_supervisor"] is False and record["signals_sent"] == []
        assert record["stopped_from_outside"] is outside
        assert record["reported_signal"] == ("SIGTERM" if outside else None)


def assert_stopped_together(envelope: dict[str, Any], marks: Path, step: int,
                            total: int) -> dict[int, dict[str, Any]]:
    """Every rank stopped at ``step`` (of ``total``), said so on the channel with its loss, left
    ``fit`` / ``train`` there with its SIGTERM handler restored, and none waited for a peer.
    Returns each rank's done file, for the library's own checks (its checkpoint)."""
    done: dict[int, dict[str, Any]] = {}
    ended = []
    for record in envelope["ranks"]:
        rank = record["rank"]
        assert record["stopped_at_step"] == step, record
        assert record["progress"]["step"] == step and record["progress"]["source"] == "channel"
        assert record["progress"]["total"] == total
        assert isinstance(record["progress"]["metrics"]["loss"], float), record["progress"]
        done[rank] = read_done(marks, rank)
        assert done[rank]["global_step"] == step, done[rank]
        assert done[rank]["stopped"] is True and done[rank]["stopped_at_step"] == step
        assert done[rank]["sigterm_handler_restored"] is True
        ended.append(datetime.fromisoformat(record["ended_at"].replace("Z", "+00:00")))
    assert max(ended) - min(ended) < timedelta(seconds=5)  # no rank left waiting for a peer
    return done
