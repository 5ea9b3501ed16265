"""Rank program that shows progress only the way HF Trainer does: a tqdm bar and loss dicts."""

import sys
import time

total = 20
for step in range(1, total + 1):
    bar = f"{step * 100 // total:3d}%|####      | {step}/{total} [00:01<00:01, 9.1it/s]"
    sys.stderr.write("\r " + bar)
    sys.stderr.flush()
    if step % 5 == 0:
        print(f"{{'loss': '{3.0 - step * 0.1:.4f}', 'grad_norm': '1.2', 'epoch': '0.5'}}",
              flush=True)
    time.sleep(0.01)
sys.stderr.write("\n")
