"""``python -m forgelm_tui``."""

from forgelm_tui.console import entry

entry()
