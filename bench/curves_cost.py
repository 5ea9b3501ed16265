"""What progress as pictures costs the TUI's main thread, in-process, without a profiler.

    python bench/curves_cost.py [--ranks 8] [--seconds 20] [--rate 10]

A real SupervisorApp (headless, ``run_test``, 200x60) on a scripted run of RANKS ranks, each
reporting RATE steps a second with a loss, is driven through SECONDS simulated seconds: each
second the steps are applied to the model (``RankProgressed`` events, as the engine delivers
them), then the table and header are refreshed and the curve panel draws (as their 1 Hz timers
do), then the screen is rendered. After a first second (which mounts the curve cells, a
one-time cost), the CPU time (``time.process_time``) of the same loop is
taken with the pictures on and with them off (no curve panel, no view history, no pace: the
``off-curves`` switch of profile_tui.py); the difference per simulated second, as % of one
core, is the cost. Alternating on / off three times; medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from scripted import T0, FakeClock, ScriptedRun

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import ProgressSource, RankState


def switch_off() -> dict[str, Any]:
    """The off-curves switch (bench/profile_tui.py); returns what to put back."""
    from forgelm_tui.tui import progress_view
    from forgelm_tui.tui.widgets import curves, run_header

    saved = {"draw": curves.CurvePanel.refresh_from_model, "add": progress_view.RankHistory.add,
             "pace": run_header._pace}
    setattr(curves.CurvePanel, "refresh_from_model", lambda self, force=False: False)  # noqa: B010
    setattr(progress_view.RankHistory, "add", lambda self, *args: None)  # noqa: B010
    setattr(run_header, "_pace", lambda model: [])  # noqa: B010
    return saved


def switch_on(saved: dict[str, Any]) -> None:
    from forgelm_tui.tui import progress_view
    from forgelm_tui.tui.widgets import curves, run_header

    setattr(curves.CurvePanel, "refresh_from_model", saved["draw"])  # noqa: B010
    setattr(progress_view.RankHistory, "add", saved["add"])  # noqa: B010
    setattr(run_header, "_pace", saved["pace"])  # noqa: B010


async def one_run(ranks: int, seconds: int, rate: int) -> float:
    """CPU seconds of the main loop over ``seconds`` simulated seconds."""
    from forgelm_tui.tui.app import build_app
    from forgelm_tui.tui.widgets.curves import CurvePanel

    run, clock = ScriptedRun(ranks), FakeClock()
    app = build_app(run, clock=clock)
    async with app.run_test(size=(200, 60)) as pilot:
        run.emit(ev.RunStarted(run.run_id, ranks, ("python",), "/runs/x", T0))
        for rank in range(ranks):
            run.emit(ev.RankStarted(rank, rank, 41000 + rank, T0), ev.RankStateChanged(
                rank, RankState.RUNNING))
        panel = app.query_one(CurvePanel)
        panel.timer.pause()
        step = 0
        await pilot.pause()
        started = time.process_time()
        for second in range(seconds + 1):
            if second == 1:  # the first second mounts the panel's cells: steady state after
                started = time.process_time()
            for _ in range(rate):
                step += 1
                clock.advance(1 / rate)
                for rank in range(ranks):
                    loss = 0.5 + 2.0 / (1 + step / 50) + (step * 7 + rank) % 5 * 0.01
                    run.emit(ev.RankProgressed(rank, step, 100_000, {"loss": loss},
                                               ProgressSource.CHANNEL))
            app.refresh_table()
            panel.refresh_from_model(force=True)
            await pilot.pause()
            await pilot.pause()
        return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rate", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    on: list[float] = []
    off: list[float] = []
    for _ in range(args.reps):
        on.append(asyncio.run(one_run(args.ranks, args.seconds, args.rate)))
        saved = switch_off()
        try:
            off.append(asyncio.run(one_run(args.ranks, args.seconds, args.rate)))
        finally:
            switch_on(saved)
    per_s = (statistics.median(on) - statistics.median(off)) / args.seconds
    print(f"{args.ranks} ranks, {args.rate} steps/s each, {args.seconds} simulated s x "
          f"{args.reps}: CPU on {[round(v, 3) for v in on]} s, off {[round(v, 3) for v in off]} s")
    print(f"pictures cost {per_s * 1000:.2f} ms of CPU per second = {per_s * 100:.2f}% of a core "
          f"(on: {statistics.median(on) / args.seconds * 100:.1f}%, "
          f"off: {statistics.median(off) / args.seconds * 100:.1f}% of the loop's work)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
