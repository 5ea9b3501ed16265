"""A minimal pidfd launcher: the floor a Python supervisor can reach on this machine.

    python bench/floor_launcher.py N program.py [args]

Not a product: no pipes, no logs, no envelope, no sampler, no guardian. It starts N ranks
(``python -u program.py``) with the torchrun variables, each in its own session, watches their
pidfds in one ``poll``, SIGTERMs every other rank group as soon as one fails (a code outside
0, 3, 4, 5, 6), SIGTERMs every group when it gets SIGTERM itself, and exits with rank 0's code
once all have ended. The bench runs it beside forgelm-tui and torchrun in scenarios a-d so the
gap between a target and what the machine itself allows is visible.
"""

import contextlib
import os
import select
import signal
import subprocess
import sys

OUTCOMES = {0, 3, 4, 5, 6}


def main() -> int:
    nproc, program = int(sys.argv[1]), sys.argv[2:]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT="29500")
        procs[rank] = subprocess.Popen([sys.executable, "-u", *program], env=env,
                                       start_new_session=True)

    def stop(skip: int | None = None) -> None:
        for rank, proc in procs.items():
            if rank != skip and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, lambda signum, frame: stop())
    poller = select.poll()
    by_fd = {}
    for rank, proc in procs.items():
        fd = os.pidfd_open(proc.pid)
        by_fd[fd] = rank
        poller.register(fd, select.POLLIN)
    codes: dict[int, int] = {}
    stopped = False
    while len(codes) < nproc:
        ready = poller.poll(120_000)
        if not ready:  # a broken bench: do not leave anything behind
            for proc in procs.values():
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
            return 2
        for fd, _ in ready:
            rank = by_fd[fd]
            poller.unregister(fd)
            os.close(fd)
            codes[rank] = procs[rank].wait()
            if codes[rank] not in OUTCOMES and not stopped:
                stopped = True
                stop(skip=rank)
    return codes[0] if codes[0] >= 0 else 128 - codes[0]


if __name__ == "__main__":
    sys.exit(main())
