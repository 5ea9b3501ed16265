"""Every field the envelope builder writes is documented in docs/envelope.md: a new field is the
builder's line, the doc's row and a test (docs/architecture.md, "Outcomes, then JSON")."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import rank_record
from test_cluster_liveness import merged

from forgelm_tui.engine.records import CancelRequest, CancelSource, ForwardRequest, StopRecord
from forgelm_tui.envelope.build import build
from forgelm_tui.plan.planner import RunInfo
from forgelm_tui.session.outcome import Attempt, Restarts, RunFrame, RunOutcome, node_outcome
from forgelm_tui.verdict import Contract, StopFacts, StopKind, decide

pytestmark = pytest.mark.timeout(30)

DOC = Path(__file__).resolve().parent.parent / "docs" / "envelope.md"


def _documented() -> set[str]:
    names = re.findall(r"`([a-z_0-9.\[\]]+)`", DOC.read_text())
    return {part.removesuffix("[]") for name in names for part in name.split(".")}


def _keys(value: Any, path: str = "") -> set[tuple[str, str]]:
    """Every (key, where) in the envelope, nested dicts and lists of dicts included; free-form
    maps (metrics, a ForgeLM result, a sender) are documented as a whole."""
    found: set[tuple[str, str]] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            found.add((key, path))
            if key not in {"metrics", "result", "forgelm_result", "sender", "error",
                           "metrics_history", "scheduler", "job_config", "exception"}:
                found |= _keys(inner, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            found |= _keys(item, path)
    return found


def _single_node_envelope() -> dict[str, Any]:
    records = [rank_record(0, pid=100, started_at=1.0, started_mono=0.0),
               rank_record(1, pid=101, started_at=1.0, started_mono=0.0)]
    records[0].mark_exit(0)
    records[1].mark_exit(-signal.SIGTERM)
    records[0].ended_mono = records[1].ended_mono = 2.0
    stop = StopRecord(StopKind.CANCEL, "operator", "operator", signal.SIGINT, 1.0, 2.0)
    cancel = CancelRequest(CancelSource.OPERATOR, "operator", signal.SIGINT, 1.0, "stop")
    forward = ForwardRequest(CancelSource.SIGNAL, "SIGUSR1", signal.SIGUSR1, 1.0, (0, 1))
    verdict = decide([r.ending() for r in records], StopFacts(StopKind.CANCEL, signal.SIGINT),
                     Contract.FORGELM)
    part = node_outcome(0, records, cancels=[cancel], forwards=[forward])
    info = RunInfo(run_id="r", command=["forgelm-tui", "x"], mode="script",
                   contract=Contract.FORGELM)
    attempt = Attempt(0, {"exit_code": 0})
    frame = RunFrame(0.0, 3.0, restarts=Restarts(1, 0, (attempt,)))
    return build(info, RunOutcome(verdict, frame, (part,), stop=stop), run_dir="/runs/x")


def test_every_field_the_builder_writes_is_documented() -> None:
    documented = _documented()
    single = _single_node_envelope()
    _, several = merged(lost=[2])
    missing = sorted({f"{where}.{key}".lstrip(".") for envelope in (single, several)
                      for key, where in _keys(envelope) if key not in documented})
    assert missing == [], f"add to docs/envelope.md: {missing}"
    assert {"root_cause_node", "nodes", "agreement", "attempts"} <= {
        key for envelope in (single, several) for key in envelope}
