"""Rank program for bench/multinode.py: a gloo all_reduce loop on CPU; leaves evidence in DIR.

argv: DIR [--seconds S] [--sleep T] [--fail-rank R --fail-code C --fail-after F]
          [--end-code C] [--rank0-code C]

* ``dist.init_process_group("gloo")`` (env:// from the launcher), then writes DIR/ready-RANK
  ("PID") and loops: ``all_reduce`` of a 1024-float tensor, ``time.sleep(T)`` (0.005).
* With --fail-rank R, rank R leaves the loop F seconds after the first all_reduce, records
  ``time.time()`` in DIR/exit-R, flushes and calls ``os._exit(C)``: it takes no part in the
  next collective and its sockets close only at exit, as in a crash. The other ranks are then
  blocked in (or about to enter) an all_reduce with it; gloo raises there ("Connection closed by
  peer"): they record ``time.time()`` and the message in DIR/gloo-error-RANK and re-raise
  (a Python exit, unless a signal from the launcher ends them first).
* Otherwise every rank loops for S seconds (the same count of iterations on every rank: rank 0
  decides when to stop and broadcasts it through the all_reduce), then ``dist.barrier()``, and
  exits: with --end-code C every rank calls ``os._exit(C)`` (after flushing); with
  --rank0-code C only rank 0 does, the others ``os._exit(0)``; with neither, every rank calls
  ``destroy_process_group()`` and returns normally (exit 0).
* Whatever happens, a rank gives up after 120 s (exit 3) so nothing outlives a broken bench.
"""

import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

out = sys.argv[1]
args = sys.argv[2:]


def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default


seconds = float(opt("--seconds", "1"))
pause = float(opt("--sleep", "0.005"))
fail_rank = opt("--fail-rank")
fail_code = int(opt("--fail-code", "2"))
fail_after = float(opt("--fail-after", "1"))
end_code = opt("--end-code")
rank0_code = opt("--rank0-code")
rank = int(os.environ["RANK"])


def write(name, text):
    path = os.path.join(out, f"{name}-{rank}")
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, text.encode())
    os.close(fd)
    os.replace(path + ".tmp", path)


def leave(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


safety = threading.Timer(120.0, leave, (3,))
safety.daemon = True
safety.start()

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
write("ready", str(os.getpid()))
tensor = torch.ones(1024)
flag = torch.zeros(1)
fails_here = fail_rank is not None and int(fail_rank) == rank
start = None
steps = 0
try:
    while True:
        dist.all_reduce(tensor)
        tensor.fill_(1.0)
        steps += 1
        now = time.monotonic()
        if start is None:
            start = now
        if fails_here and now - start >= fail_after:
            stamp = time.time()
            write("exit", repr(stamp))
            leave(fail_code)
        if fail_rank is None:
            flag.fill_(1.0 if rank == 0 and now - start >= seconds else 0.0)
            dist.all_reduce(flag)  # every rank leaves the loop at the same iteration
            if flag.item() > 0:
                break
        time.sleep(pause)
except RuntimeError as exc:  # gloo: a peer went away (DistBackendError is a RuntimeError)
    write("gloo-error", f"{time.time()!r} {str(exc).splitlines()[0][:200]}")
    raise
print(f"rank {rank}: {steps} steps", flush=True)
dist.barrier()
if end_code is not None:
    leave(int(end_code))
if rank0_code is not None:
    leave(int(rank0_code) if rank == 0 else 0)
dist.destroy_process_group()
