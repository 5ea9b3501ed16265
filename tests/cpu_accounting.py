"""Where the suite's time goes: each test's wall and CPU (its own and its children's, ranks and
supervisors included once reaped), a line of JSON per test, one file per worker.

    CPU_ACCOUNTING=/tmp/acct pytest               # conftest loads this plugin then
    python tests/cpu_accounting.py /tmp/acct      # per file, the 40 costliest tests, the tail
    python tests/cpu_accounting.py /tmp/acct --save   # and each file's wall -> file_costs.json

file_costs.json orders the session: the files that take longest start first, each file on one
xdist worker (conftest.py), so the run does not end on one long file while the other workers
idle. A file it does not name counts as FILE_COST_DEFAULT seconds.

CPU is the figure to compare on a shared machine: wall moves with the load, CPU much less.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get("CPU_ACCOUNTING")
    began, (own, kids) = time.monotonic(), _cpu()
    yield
    if out:
        own2, kids2 = _cpu()
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(Path(out) / f"{os.getpid()}.jsonl", "a") as handle:
            handle.write(json.dumps({"id": item.nodeid, "start": began,
                                     "wall": time.monotonic() - began,
                                     "self": own2 - own, "kids": kids2 - kids}) + "\n")


def report(directory: Path) -> None:
    rows = [json.loads(line) for path in directory.glob("*.jsonl") for line in path.open()]
    cpu = sum(r["self"] + r["kids"] for r in rows)
    print(f"{len(rows)} tests: wall summed {sum(r['wall'] for r in rows):.1f} s, CPU {cpu:.1f} s")
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        entry = files[r["id"].split("::")[0]]
        entry[0] += 1
        entry[1] += r["wall"]
        entry[2] += r["self"] + r["kids"]
    print(f"{'file':45} {'tests':>5} {'wall':>7} {'cpu':>7}")
    for name, (n, wall, used) in sorted(files.items(), key=lambda kv: -kv[1][2]):
        print(f"{name:45} {n:5d} {wall:7.1f} {used:7.1f}")
    print()
    for r in sorted(rows, key=lambda r: -(r["self"] + r["kids"]))[:40]:
        print(f"{r['self'] + r['kids']:6.1f} cpu {r['wall']:6.1f} wall  {r['id']}")
    timed = [r for r in rows if "start" in r]
    if timed:  # the tail: what each worker ran last, in seconds from the first test's start
        zero = min(r["start"] for r in timed)
        print("\nthe tail (start .. end, seconds from the first test):")
        for r in sorted(timed, key=lambda r: -(r["start"] + r["wall"]))[:15]:
            begin = r["start"] - zero
            print(f"{begin:6.1f} .. {begin + r['wall']:6.1f}  {r['id']}")


COSTS = Path(__file__).with_name("file_costs.json")
FILE_COST_DEFAULT = 2.0


def file_walls(directory: Path) -> dict[str, float]:
    """Each test file's wall (its tests' summed), as one run measured it."""
    walls: dict[str, float] = collections.defaultdict(float)
    for path in directory.glob("*.jsonl"):
        for line in path.open():
            row = json.loads(line)
            walls[row["id"].split("::")[0]] += row["wall"]
    return {name: round(wall, 1) for name, wall in sorted(walls.items())}


def file_costs() -> dict[str, float]:
    return json.loads(COSTS.read_text()) if COSTS.exists() else {}


if __name__ == "__main__":
    report(Path(sys.argv[1]))
    if "--save" in sys.argv[2:]:
        COSTS.write_text(json.dumps(file_walls(Path(sys.argv[1])), indent=1) + "\n")
        print(f"\nwrote {COSTS}")
