"""``forgelm-tui demo``: a small, real DDP training run on CPU (torch, gloo)."""
