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
        ("forgelm_tui.engine.supervisor, forgelm_tui.verdict, forgelm_tui.envelope.build", []),
        ("forgelm_tui.cli, forgelm_tui.plan.planner, forgelm_tui.session.run, "
         "forgelm_tui.headless.view", []),
    ],
)
def test_imports_stay_light(modules: str, allowed: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(modules=modules)],
                          capture_output=True, text=True, timeout=20, check=True)
    assert proc.stdout.strip() == repr(allowed)


def test_plan_and_ending_types_import_neither_views_nor_the_engine() -> None:
    probe = ("import sys\nimport forgelm_tui.plan.planner, forgelm_tui.session.ending, "
             "forgelm_tui.plan.options\n"
             "print(sorted(m for m in sys.modules if m.startswith(('forgelm_tui.engine.',"
             " 'forgelm_tui.tui', 'forgelm_tui.headless', 'forgelm_tui.session.run',"
             " 'textual'))))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=20, check=True)
    # The launch spec is the engine's input: plain data, no process code.
    assert proc.stdout.strip() == repr(["forgelm_tui.engine.spec"])


def test_the_scripted_test_run_is_not_in_the_package() -> None:
    import importlib.util

    assert importlib.util.find_spec("forgelm_tui.tui.scripted") is None
