"""Architecture contracts: the engine imports no view and no torch; --no-tui imports no textual."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(30)

PROBE = (
    "import sys\n"
    "import {modules}\n"
    "print(sorted(m for m in ('textual', 'rich', 'torch') if m in sys.modules))\n"
)


@pytest.mark.parametrize(
    ("modules", "allowed"),
    [
        ("forgelm_tui.engine.supervisor, forgelm_tui.verdict, forgelm_tui.envelope", []),
        ("forgelm_tui.cli, forgelm_tui.plan, forgelm_tui.run, forgelm_tui.headless", []),
    ],
)
def test_imports_stay_light(modules: str, allowed: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(modules=modules)],
                          capture_output=True, text=True, timeout=20, check=True)
    assert proc.stdout.strip() == repr(allowed)
