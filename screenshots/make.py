"""Regenerate the README screenshots from the scripted states the snapshot tests use.

    python screenshots/make.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from scripted import STATES, scripted_app
from scripted_gpu import MEMORY, RUNNING, devices, gpu_app, sample

HERE = Path(__file__).resolve().parent
SIZE = (170, 42)


async def shoot(name: str) -> Path:
    app, _, prepare = scripted_app(name)
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        return Path(app.save_screenshot(filename=f"{name}.svg", path=str(HERE)))


async def shoot_gpus() -> Path:
    """8 ranks on 8 GPUs, rank 3 close to running out (the GPU snapshot test's state)."""
    app, _, prepare = gpu_app(sample(devices(), RUNNING, MEMORY))
    async with app.run_test(size=SIZE) as pilot:
        await prepare(pilot)
        return Path(app.save_screenshot(filename="gpus.svg", path=str(HERE)))


def main() -> None:
    for name in STATES:
        print(asyncio.run(shoot(name)))
    print(asyncio.run(shoot_gpus()))


if __name__ == "__main__":
    main()
