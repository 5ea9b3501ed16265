"""ruff and mypy are part of the test run, so CI fails on either."""

from __future__ import annotations

import subprocess
import sys

import pytest
from lint_jobs import result


@pytest.mark.timeout(120)
def test_ruff_clean() -> None:
    code, output = result("ruff", 110)
    assert code == 0, output


@pytest.mark.timeout(300)
def test_mypy_clean() -> None:
    if subprocess.run([sys.executable, "-m", "mypy", "--version"],
                      capture_output=True).returncode != 0:
        pytest.fail("mypy is not installed: pip install -e '.[test]'")
    code, output = result("mypy", 290)
    assert code == 0, output
