"""docs/faults.md and the tests agree: every row has a test, every test marked with a fault id
is a row, and each row names exactly the tests that carry its id."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| (F\d\d) \|.*\| ([^|]*) \|$")


def _rows() -> dict[str, set[str]]:
    rows: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "faults.md").read_text().splitlines():
        if (m := ROW.match(line)) is not None:
            assert m.group(1) not in rows, f"{m.group(1)} twice"
            rows[m.group(1)] = set(re.findall(r"`([\w.]+::\w+)`", m.group(2)))
    return rows


def _fault_ids(decorator: ast.expr) -> list[str]:
    if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "fault"):
        return [a.value for a in decorator.args if isinstance(a, ast.Constant)]
    return []


def _marked() -> dict[str, set[str]]:
    marked: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for decorator in node.decorator_list:
                    for fid in _fault_ids(decorator):
                        marked.setdefault(fid, set()).add(f"{path.name}::{node.name}")
    return marked


def test_the_matrix_has_at_least_30_rows_each_with_a_test() -> None:
    rows = _rows()
    assert len(rows) >= 30
    assert not [fid for fid, tests in rows.items() if not tests]


def test_every_row_names_exactly_the_tests_marked_with_its_id() -> None:
    rows, marked = _rows(), _marked()
    assert set(marked) <= set(rows), "marked with an id that is no row"
    assert {fid: rows[fid] for fid in rows} == {fid: marked.get(fid, set()) for fid in rows}
