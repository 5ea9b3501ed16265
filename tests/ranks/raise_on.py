"""Rank R ends the way MODE says; the other ranks sleep until they are stopped.

argv: R MODE, MODE one of:
  raise   an uncaught RuntimeError (exit 1 with a traceback at the end of stderr): a crash
  exit    print an error line and ``sys.exit(1)`` (a deliberate 1, as ForgeLM's config error)
  logged  print a handled exception's traceback, then 60 more lines, then ``sys.exit(1)``
"""

import os
import sys
import time
import traceback

victim, mode = int(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
print(f"rank {rank} started", flush=True)
if rank != victim:
    time.sleep(60)
    sys.exit(0)
if mode == "raise":
    raise RuntimeError(f"rank {rank}: simulated crash")
if mode == "logged":
    try:
        raise ValueError("handled and logged")
    except ValueError:
        traceback.print_exc()
    for index in range(60):
        print(f"carrying on {index}", file=sys.stderr, flush=True)
print("error: bad argument --foo", file=sys.stderr, flush=True)
sys.exit(1)
