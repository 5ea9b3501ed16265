"""The ``--no-tui`` view: plain rank-prefixed lines and a final summary."""
