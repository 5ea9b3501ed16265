"""``python -m forgelm_tui``."""

from forgelm_tui.cli import entry

entry()
