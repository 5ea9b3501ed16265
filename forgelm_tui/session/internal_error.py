"""The last net: an exception that escaped the whole run (a bug past every other net).

The caller has stopped every rank (the guardian's abandon); this says so in one line, writes an
envelope that names the exception (``supervisor_error``) and returns 2: the run did not complete.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forgelm_tui.engine.faults import describe_exception, fault_verdict
from forgelm_tui.envelope.build import without_attempts
from forgelm_tui.envelope.write import write_each
from forgelm_tui.isotime import iso
from forgelm_tui.plan.planner import Plan
from forgelm_tui.session.ending import RunEnding


def report_internal_error(plan: Plan, exc: BaseException, say: Callable[[str], None],
                          emit_json: Callable[[dict[str, Any]], None]) -> int:
    error = describe_exception(exc, "forgelm-tui")
    verdict = fault_verdict(error)
    envelope, written, errors = write_each(plan.envelope_paths, lambda failed: without_attempts(
        plan.info, verdict, supervisor_error=error.to_dict(iso(error.at)), not_written=failed))
    where = RunEnding(verdict, envelope, None, tuple(errors), tuple(written)).where_line(
        plan.output_format == "json")
    say(f"forgelm-tui: internal error: {error.line}; every rank was stopped "
        f"(exit {verdict.code} {verdict.name}{where})")
    for message in errors:
        say(f"forgelm-tui: {message}")
    if plan.output_format == "json":
        emit_json(envelope)
    return verdict.code
