"""Regenerate the README screenshots from the scripted states the snapshot tests use.

    python screenshots/make.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from forgelm_tui.tui.app import build_app
from forgelm_tui.tui.scripted import STATES, FakeClock, ScriptedRun

HERE = Path(__file__).resolve().parent
SIZE = (140, 42)


async def shoot(name: str) -> Path:
    world, play = STATES[name]
    run = ScriptedRun(world)
    clock = FakeClock()
    app = build_app(run, clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        if name in ("failed", "approval"):
            run.finish(play(run, clock, None))
        else:
            play(run, clock)
        await pilot.pause()
        app.refresh_table()
        app.flush_logs()
        await pilot.pause()
        return Path(app.save_screenshot(filename=f"{name}.svg", path=str(HERE)))


def main() -> None:
    for name in STATES:
        print(asyncio.run(shoot(name)))


if __name__ == "__main__":
    main()
