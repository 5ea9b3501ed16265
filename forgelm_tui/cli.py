"""The console script: argv -> a checked plan -> a view -> the run's true exit code."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence

import forgelm_tui.lean_asyncio  # noqa: F401  (first: asyncio without OpenSSL's libraries)
from forgelm_tui.early_signals import holds_signals
from forgelm_tui.engine.own_signals import hold_early
from forgelm_tui.plan.options import UsageError
from forgelm_tui.plan.planner import Planner
from forgelm_tui.session.run import execute, prelaunch_error, stderr_line


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def entry() -> None:
    """The console script: run, flush, and leave without interpreter teardown.

    Everything that matters (the envelope, the summary, the terminal) is done when ``main``
    returns; tearing down the imported modules would only delay CI by tens of milliseconds.
    Only here, in the CLI's own process (never in a caller of ``main``, whose children would
    inherit it), the usual signals are blocked at once, so that one arriving while the run is
    planned waits for the run's handlers (engine/own_signals.py, ``hold_early``).
    """
    if holds_signals(sys.argv):
        hold_early()  # (console.py blocked them already: this hands them to the inbox)
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed stdout never changes the code
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["attach"], ["ls"], ["serve"]):
        return viewer_command(args)
    planner = Planner(args, new_run_id())
    try:
        plan = planner.plan()
    except UsageError as exc:
        return prelaunch_error(
            str(exc), planner.info, planner.envelope_paths(), planner.output_format, stderr_line
        )
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    for warning in plan.warnings:  # also in the envelope's settings, for the TUI's users
        stderr_line(f"[forgelm-tui] warning: {warning}")
    if plan.view == "tui":
        from forgelm_tui.tui.launch import execute_tui

        return execute_tui(plan)
    return execute(plan)


def viewer_command(args: list[str]) -> int:
    """`attach [RUN_DIR | RUN_ID]`, `serve [RUN_DIR | RUN_ID]` and `ls`: they watch runs, never
    start one."""
    import argparse

    from forgelm_tui.plan.options import UsageError, viewer_parser

    try:
        ns = viewer_parser(args[0]).parse_args(args[1:])
    except UsageError as exc:
        stderr_line(f"forgelm-tui {args[0]}: {exc}")
        return 1
    except SystemExit as exc:
        return int(exc.code or 0)
    if args[0] == "ls":
        from forgelm_tui.control.find import ls_text

        sys.stdout.write(ls_text())
        return 0
    assert isinstance(ns, argparse.Namespace)
    if args[0] == "serve":
        from forgelm_tui.control.serve import execute_serve

        return execute_serve(ns.run, ns.host, ns.port, ns.allow_remote, stderr_line,
                             ns.read_only)
    from forgelm_tui.tui.attach import execute_attach

    with contextlib.suppress(OSError):  # a viewer yields the CPU to the run (docs/control.md)
        os.nice(ns.nice)
    return execute_attach(ns.run, ns.read_only, stderr_line, ns.via)
