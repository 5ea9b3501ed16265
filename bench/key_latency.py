"""Key latency of the TUI during a flood of long lines (goal: median within 200 ms, quiet machine).

2 ranks print 60 KB lines as fast as they can (tests/ranks/wide_flood.py); the TUI runs in a
private tmux server; ``f`` (the log's follow toggle) is pressed N times and the time from
send-keys to the changed log title on screen is taken each time. This was a test's assert
until issue 19: a timing goal belongs here, where it is measured on a quiet machine.

    python bench/key_latency.py [--presses 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TITLE = re.compile(r"log: all ranks · (following|paused)")


def tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True,
                          timeout=10, check=True).stdout


def title(sock: str) -> str | None:
    found = TITLE.search(tmux(sock, "capture-pane", "-p", "-J"))
    return found.group(1) if found else None


def wait(what: str, check: object, timeout: float = 30.0, step: float = 0.005) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()  # type: ignore[operator]
        if value:
            return value
        time.sleep(step)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presses", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sock = f"ftui-bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        cli = [sys.executable, "-m", "forgelm_tui", "--tui", "--run-dir", f"{tmp}/run",
               "--nproc-per-node", "2", "--grace", "3",
               str(ROOT / "tests" / "ranks" / "wide_flood.py"), str(60 * 1024), "60"]
        tmux(sock, "new-session", "-d", "-x", "150", "-y", "45", "-eCI=", "sh", "-c",
             "unset COLUMNS LINES; " + " ".join(f"'{a}'" for a in cli))
        try:
            wait("the run", lambda: "RUNNING" in tmux(sock, "capture-pane", "-p"), 60)
            latencies = []
            for _ in range(args.presses):
                before = wait("the log title", lambda: title(sock))
                start = time.monotonic()
                tmux(sock, "send-keys", "f")
                wait("the title to change",
                     lambda before=before: title(sock) not in (None, before))
                latencies.append(time.monotonic() - start)
        finally:
            subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=10)
    median = statistics.median(latencies)
    print(f"key latency during a flood of 60 KB lines: median {median * 1e3:.0f} ms, "
          f"max {max(latencies) * 1e3:.0f} ms over {len(latencies)} presses "
          f"({'pass' if median < 0.2 else 'MISS'}: goal 200 ms)")
    if args.json:
        args.json.write_text(json.dumps({"latencies_s": latencies, "median_s": median}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
