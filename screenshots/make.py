"""Regenerate the README screenshots from the scripted states the snapshot tests use, and
the attach viewer (`forgelm-tui attach`) on the same running state, fed as from a socket.

    python screenshots/make.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from scripted import STATES, FakeClock, ScriptedRun, scripted_app, state_running
from scripted_gpu import MEMORY, RUNNING, devices, gpu_app, sample

from forgelm_tui.engine import events as ev

HERE = Path(__file__).resolve().parent
SIZE = (170, 42)


async def shoot(name: str) -> Path:
    app, _, prepare = scripted_app(name)
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        return Path(app.save_screenshot(filename=f"{name}.svg", path=str(HERE)))


class SnapshotOnly:
    """A control client that has sent its snapshot: the events follow from the script."""

    path, supervisor_pid = Path("/nonexistent"), None

    def __init__(self, run: ScriptedRun) -> None:
        self.snapshot = ev.RunSnapshot(run.run_id, run.world_size, tuple(run.command),
                                       "/runs/x", None, ())

    def next_item(self) -> ev.RunSnapshot:
        return self.snapshot

    def send(self, kind: str, **fields: object) -> None:
        """Commands and ``watch`` go nowhere."""


async def shoot_attach() -> Path:
    """`forgelm-tui attach` on the running state: the same screen, and `d` in the key line."""
    from forgelm_tui.tui.attach import AttachApp, AttachedRun

    run, clock = ScriptedRun(8), FakeClock()
    handle = AttachedRun(SnapshotOnly(run))  # type: ignore[arg-type]
    app = AttachApp(handle, clock=clock, auto_start=False)
    run.subscribe(handle._deliver)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        state_running(run, clock)
        app.flush_logs()
        handle.on_skipped(18_240)  # a flood elsewhere: what the tail left out, as a viewer sees it
        run.emit(ev.RankOutput.of(0, ev.Stream.STDOUT, ("{'loss': 2.1800, 'step': 31}",)))
        await pilot.pause()
        app.refresh_table()
        app.flush_logs()
        await pilot.pause()
        return Path(app.save_screenshot(filename="attach.svg", path=str(HERE)))


async def shoot_gpus() -> Path:
    """8 ranks on 8 GPUs, rank 3 close to running out (the GPU snapshot test's state)."""
    app, _, prepare = gpu_app(sample(devices(), RUNNING, MEMORY))
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        return Path(app.save_screenshot(filename="gpus.svg", path=str(HERE)))


def main() -> None:
    """Every screenshot, or those named (``python screenshots/make.py attach gpus``)."""
    extra = {"attach": shoot_attach, "gpus": shoot_gpus}
    for name in sys.argv[1:] or [*STATES, *extra]:
        print(asyncio.run(extra[name]() if name in extra else shoot(name)))


if __name__ == "__main__":
    main()
