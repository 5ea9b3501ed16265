"""forgelm-tui: launch torch.distributed ranks, stop them together, report the true exit code."""

__version__ = "0.1.0"
