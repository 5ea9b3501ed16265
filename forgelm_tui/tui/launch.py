"""Running a plan under the TUI: the same session as headless, a different view."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable

from textual.app import App

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.guardian import Guardian
from forgelm_tui.engine.loop import new_loop
from forgelm_tui.engine.own_signals import take_senders
from forgelm_tui.envelope.storage import not_kept_line
from forgelm_tui.plan.planner import Plan
from forgelm_tui.session.internal_error import report_internal_error
from forgelm_tui.session.run import Session
from forgelm_tui.tui.app import build_app
from forgelm_tui.wording.ending import ending_notes, log_not_kept_text


def execute_tui(plan: Plan) -> int:
    guardian = Guardian()  # forked first, before Textual starts any thread
    take_senders(plan.spec.forward_signals)  # ...and this before any thread too
    session = Session(plan, guardian)
    app = build_app(session, terminal_fd=_terminal_fd(), before_hard_exit=guardian.close)
    session.hooks.hangup_origin = app.hangup_origin
    session.hooks.watching = app.watching  # the other nodes' ranks it shows (cluster/views.py)
    session.subscribe(storage_notice(app))
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:  # a rank's exit first
            code = runner.run(app.run_async())
    finally:
        if session.ending is None:
            guardian.abandon()  # the view died mid-run: the guardian stops every rank group
        else:
            guardian.close()
    ending = session.ending
    if ending is None:  # the guardian stopped every rank group; the envelope says why
        error = RuntimeError("the view ended before the run")
        return report_internal_error(plan, error, _say, lambda _: None)
    verdict = ending.verdict
    lost = not_kept_line(ending.envelope)
    for note in (*ending.write_errors, *ending_notes(ending.envelope), *([lost] if lost else [])):
        _say(f"forgelm-tui: {note}")
    _say(f"forgelm-tui: exit {verdict.code} {verdict.name} ({verdict.rule_text})"
         f"{ending.where_line()}")
    return code if code is not None else verdict.code


def storage_notice(app: App[int]) -> Callable[[ev.Event], None]:
    """The first rank log that cannot be written, said once, live (the verdict panel and the
    exit line say what was lost)."""
    told: list[ev.LogNotKept] = []

    def listener(event: ev.Event) -> None:
        if isinstance(event, ev.LogNotKept) and not told:
            told.append(event)
            app.notify(log_not_kept_text(event), title="storage", severity="warning",
                       timeout=30)

    return listener


def _terminal_fd() -> int | None:
    """The terminal the app draws on, watched so that a closed terminal stops the run."""
    for stream in (sys.__stdin__, sys.__stdout__):
        try:
            if stream is not None and os.isatty(stream.fileno()):
                return stream.fileno()
        except (OSError, ValueError):
            continue
    return None


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
