"""Rank program for the latency and orphan scenarios; leaves evidence in a directory.

argv: DIR [--exit-ranks R,R|all] [--exit-code C] [--sleep S] [--child]

* With --child, starts ``sleep 3600`` as a child first.
* Waits for SIGTERM with SIGTERM blocked and ``sigtimedwait``: a Python handler around
  ``time.sleep`` can miss a signal that lands just before the sleep starts (it then runs only
  when the sleep ends), which showed up as 0.5 s outliers. On SIGTERM it records
  ``time.time()`` in DIR/term-RANK and exits 143.
* Writes DIR/ready-RANK ("PID [CHILD_PID]") once set up.
* With --exit-ranks, waits until every rank of the world is ready, then the listed ranks
  record ``time.time()`` in DIR/exit-RANK and ``os._exit(C)`` right after; the others wait.
* With --sleep S, waits S seconds after being ready, then records and exits 0 the same way.
* Whatever happens, it exits by itself after 120 s so nothing outlives a broken bench.
"""

import os
import signal
import subprocess
import sys
import time

out = sys.argv[1]
args = sys.argv[2:]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])


def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default


exit_ranks = opt("--exit-ranks")
exit_code = int(opt("--exit-code", "0"))
sleep = opt("--sleep")
SAFETY = time.monotonic() + 120.0


def write(name, text):
    path = os.path.join(out, f"{name}-{rank}")
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, text.encode())
    os.close(fd)
    os.replace(path + ".tmp", path)


def wait_term(seconds):
    """Wait up to ``seconds`` for SIGTERM; on SIGTERM record the time and exit 143."""
    if signal.sigtimedwait([signal.SIGTERM], max(0.0, seconds)) is not None:
        now = time.time()
        write("term", repr(now))
        os._exit(143)


def exit_now(code):
    now = time.time()
    write("exit", repr(now))
    os._exit(code)


pids = [os.getpid()]
if "--child" in args:  # before blocking SIGTERM: the child must not inherit the blocked mask
    child = subprocess.Popen(["sleep", "3600"])
    pids.append(child.pid)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
write("ready", " ".join(map(str, pids)))

mine = exit_ranks is not None and (
    exit_ranks == "all" or str(rank) in exit_ranks.split(",")
)
if mine:
    want = [os.path.join(out, f"ready-{r}") for r in range(world)]
    while not all(os.path.exists(p) for p in want):
        if time.monotonic() > SAFETY:
            os._exit(3)
        wait_term(0.001)
    exit_now(exit_code)
if sleep is not None:
    end = time.monotonic() + float(sleep)
    while time.monotonic() < end:
        wait_term(end - time.monotonic())
    exit_now(0)
while time.monotonic() < SAFETY:
    wait_term(SAFETY - time.monotonic())
os._exit(3)
