"""``python -m forgelm_tui``."""

from forgelm_tui.cli import main

raise SystemExit(main())
