"""A gloo training-like loop that gets SIGTERM on one rank only, at step K (the #20825 injection).

argv: PATTERN SIGNAL_RANK SIGNAL_STEP STEPS
PATTERN:
  helper             forgelm_tui.rank.StopAgreement: record in the handler, agree at the step end
  local-flag         a flag each rank acts on alone (as before Lightning PR #20825)
  handler-collective a broadcast inside the signal handler (as Lightning 2.6.6 does)
Prints "STOPPED at step N" when it leaves the loop on a stop, "FINISHED" after the last step.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from forgelm_tui.rank import StopAgreement, report_progress

pattern, signal_rank, signal_step, steps = sys.argv[1], *map(int, sys.argv[2:5])
signal_rank %= int(os.environ["WORLD_SIZE"])  # -1: the last rank
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
stopping = {"flag": False}


def local_flag(signum, frame):
    stopping["flag"] = True


def collective_in_handler(signum, frame):
    flag = torch.tensor([1])
    dist.broadcast(flag, src=rank)  # pairs with whatever collective the other rank is in
    stopping["flag"] = bool(flag.item())


agreement = StopAgreement() if pattern == "helper" else None
if agreement:
    agreement.install()
elif pattern == "local-flag":
    signal.signal(signal.SIGTERM, local_flag)
else:
    signal.signal(signal.SIGTERM, collective_in_handler)

grad = torch.ones(4096)
for step in range(1, steps + 1):
    if rank == signal_rank and step == signal_step:
        os.kill(os.getpid(), signal.SIGTERM)  # only this rank is signalled
    dist.all_reduce(grad)  # the "gradient" all-reduce every rank must join
    grad.fill_(1.0)
    report_progress(step, steps)
    print(f"rank {rank} step {step}", flush=True)
    stop = agreement.should_stop(step) if agreement else stopping["flag"]
    if stop:
        print(f"STOPPED at step {step}", flush=True)
        break
    time.sleep(0.02)
else:
    print("FINISHED", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(0)
