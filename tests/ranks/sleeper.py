"""Rank program that waits to be signalled, leaving evidence in a directory.

argv: DIR [--ignore-term RANK] [--child] [--exit-on-term CODE] [--sleep S] [--no-usr1 RANK]
Writes DIR/ready-RANK (with its pid, and its child's pid with --child) once set up, and
DIR/got-SIGNAME-RANK (with a timestamp) for every SIGTERM / SIGUSR1 / SIGUSR2 received.
"""

import os
import signal
import subprocess
import sys
import time

out = sys.argv[1]
args = sys.argv[2:]
rank = int(os.environ["RANK"])
ignore_rank = int(args[args.index("--ignore-term") + 1]) if "--ignore-term" in args else None
exit_on_term = int(args[args.index("--exit-on-term") + 1]) if "--exit-on-term" in args else None
sleep = float(args[args.index("--sleep") + 1]) if "--sleep" in args else 3600.0
no_usr1 = int(args[args.index("--no-usr1") + 1]) if "--no-usr1" in args else None


def mark(name: str, text: str) -> None:
    path = os.path.join(out, f"{name}-{rank}")
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def on_signal(signum, frame):
    name = signal.Signals(signum).name
    mark(f"got-{name}", repr(time.time()))
    if signum == signal.SIGTERM and rank != ignore_rank:
        if exit_on_term is not None:
            sys.exit(exit_on_term)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    if not (sig == signal.SIGUSR1 and rank == no_usr1):  # that rank dies of SIGUSR1
        signal.signal(sig, on_signal)

pids = [os.getpid()]
if "--child" in args:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    pids.append(child.pid)
print(f"rank {rank} ready", flush=True)
mark("ready", " ".join(map(str, pids)))
deadline = time.time() + sleep
while time.time() < deadline:
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
