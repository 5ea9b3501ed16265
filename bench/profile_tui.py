"""Where forgelm-tui's TUI spends its CPU: the real CLI in-process, profiled or with a part off.

    python bench/profile_tui.py [--profile OUT --from S --to T] [--off PART ...] -- ARGS

ARGS are forgelm-tui's own (``--tui --nproc-per-node 64 ... script.py``). Run it where
forgelm-tui would run, in a terminal: ``bench/tui.py --cpu-variants ...`` starts it in tmux.

--off PART switches one part of the view off, to measure what it costs by its absence:
  table    the rank table gets its rows once, then no cell is ever updated
  header   the two header lines are never re-rendered
  samples  RankSampled events (1 Hz per rank) never reach the model
  logs     the log pane is never fed (the model still keeps every line)
  output   RankOutput events never reach the model (no line kept, nothing for the log pane)
  curves   progress as pictures off: no curve panel, no history or step rate kept by the view,
           no pace in the header (the bars stay: a column of the table)
--profile OUT: cProfile of the main thread (Textual's event loop, which also runs the engine)
from S to T seconds after the app is mounted (or to its end), written as pstats to OUT.
--marks FILE: time.time() of the steps to the first frame, one JSON line each as it happens:
  wrapper started, engine/CLI imported, TUI imported, execute_tui entered, guardian forked,
  on_mount entered/left, ranks spawned (start/end), first frames written (App._display).

Not a product and not a test: a measuring tool. It leaves like forgelm-tui (os._exit).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

PARTS = ("table", "header", "samples", "logs", "output", "curves")


class Marks:
    """Appends ``{"mark": NAME, "t": time.time()}`` lines; flushed at once (the app may
    leave with os._exit)."""

    def __init__(self, path: Path | None) -> None:
        self._handle = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        self.seen: dict[str, int] = {}

    def __call__(self, name: str, limit: int = 1) -> None:
        if self._handle is None or self.seen.get(name, 0) >= limit:
            return
        self.seen[name] = self.seen.get(name, 0) + 1
        self._handle.write(json.dumps({"mark": name, "t": time.time()}) + "\n")


def mark_steps(mark: Marks) -> None:
    """Wrap the steps between the start of the process and the first frames."""
    import forgelm_tui.cli
    import forgelm_tui.plan.planner
    import forgelm_tui.session.run  # noqa: F401

    mark("engine and CLI imported")
    from forgelm_tui.engine.supervisor import Supervisor
    from forgelm_tui.tui import app as tui_app
    from forgelm_tui.tui import launch

    mark("TUI imported (textual)")

    def wrap(owner: Any, name: str, before: str, after: str | None = None,
             limit: int = 1) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)  # Textual reads a handler's signature to call it
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            mark(before, limit)
            try:
                return original(*args, **kwargs)
            finally:
                if after:
                    mark(after, limit)

        setattr(owner, name, wrapped)

    wrap(launch, "execute_tui", "execute_tui entered")
    wrap(launch, "Guardian", "guardian fork starts", "guardian forked")
    wrap(tui_app.SupervisorApp, "on_mount", "on_mount entered", "on_mount left")
    wrap(Supervisor, "_spawn_all", "ranks: spawning starts", "ranks: all spawned")
    wrap(tui_app.SupervisorApp, "_display", "frame written", limit=3)


DUMPS: list[Any] = []  # the profile's dump, also run when the app ends before T


def patch(off: list[str], profile: Path | None, start: float, stop: float) -> None:
    from forgelm_tui.engine import events as ev
    from forgelm_tui.tui import app as tui_app
    from forgelm_tui.tui.model import RunModel
    from forgelm_tui.tui.widgets.rank_table import RankTable

    if "table" in off:
        refresh_from = RankTable.refresh_from

        def rows_once(self: RankTable, model: RunModel) -> None:
            if self.row_count < len(model.ranks):
                refresh_from(self, model)

        setattr(RankTable, "refresh_from", rows_once)  # noqa: B010 (monkeypatch, untyped)
    if "header" in off:
        render_for = tui_app.RunHeader.render_for
        drawn: set[int] = set()

        def once(self: Any, model: RunModel, label: str | None) -> None:
            if id(self) not in drawn:
                drawn.add(id(self))
                render_for(self, model, label)

        setattr(tui_app.RunHeader, "render_for", once)  # noqa: B010
    dropped = tuple(kind for part, kind in (("samples", ev.RankSampled),
                                            ("output", ev.RankOutput)) if part in off)
    if dropped:
        apply = RunModel.apply

        def without(self: RunModel, event: ev.Event) -> None:
            if not isinstance(event, dropped):
                apply(self, event)

        setattr(RunModel, "apply", without)  # noqa: B010
    if "logs" in off:
        setattr(tui_app.SupervisorApp, "flush_logs", lambda self: None)  # noqa: B010
    if "curves" in off:
        from forgelm_tui.tui import progress_view
        from forgelm_tui.tui.widgets import curves, run_header

        setattr(curves.CurvePanel, "refresh_from_model",  # noqa: B010
                lambda self, force=False: False)
        setattr(progress_view.RankHistory, "add", lambda self, *args: None)  # noqa: B010
        setattr(run_header, "_pace", lambda model: [])  # noqa: B010
    if profile is not None:
        on_mount = tui_app.SupervisorApp.on_mount
        profiler = cProfile.Profile()

        def dump() -> None:
            if DUMPS:
                DUMPS.clear()
                profiler.disable()
                profiler.dump_stats(str(profile))

        DUMPS.append(dump)

        def enable() -> None:  # Textual inspects a timer callback: a builtin has no signature
            profiler.enable()

        def mounted(self: Any) -> None:
            on_mount(self)
            if start > 0:
                self.set_timer(start, enable)
            else:  # a Textual timer of 0 s never fires
                enable()
            self.set_timer(stop, dump)

        setattr(tui_app.SupervisorApp, "on_mount", mounted)  # noqa: B010


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--off", action="append", default=[], choices=PARTS)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--from", dest="start", type=float, default=10.0)
    parser.add_argument("--to", dest="stop", type=float, default=40.0)
    parser.add_argument("--marks", type=Path, default=None)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    mark = Marks(opts.marks)
    mark("wrapper started (python up, argparse imported)")
    if opts.marks is not None:
        mark_steps(mark)
    patch(opts.off, opts.profile, opts.start, opts.stop)
    from forgelm_tui import cli

    code = cli.main(args)
    for dump in list(DUMPS):
        dump()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
