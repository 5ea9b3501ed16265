"""The shape of the code, checked: small modules, short functions, no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(__file__).resolve().parent.parent / "forgelm_tui"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def test_no_module_is_longer_than_400_lines() -> None:
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_bytes().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def _literal_lines(node: ast.AST) -> int:
    """Lines taken by data literals (tables, long strings) inside ``node``: they do not count."""
    total = 0
    for child in ast.walk(node):
        if isinstance(child, ast.Dict | ast.List | ast.Tuple | ast.Set | ast.Constant) and \
                child.end_lineno is not None and child.end_lineno > child.lineno:
            total = max(total, child.end_lineno - child.lineno)
    return total


def test_no_function_is_longer_than_60_lines() -> None:
    long = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno - _literal_lines(node)
                if length > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = length
    assert long == {}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every forgelm_tui module ``path`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycles.append([*path[path.index(name):], name])
            return
        if name in done:
            return
        for target in sorted(graph.get(name, ())):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    return cycles


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_every_controller_target_has_the_one_command_signature() -> None:
    """Keys, signals, viewers and the engine reach a run through the same commands with the
    same signature (engine/controls.py): the session, the attempt's supervisor, an attached
    viewer's handle and the tests' scripted run alike; no caller picks a policy's cause."""
    import inspect

    from scripted import ScriptedRun

    from forgelm_tui.engine.controls import Controls
    from forgelm_tui.engine.supervisor import Supervisor
    from forgelm_tui.session.run import Session
    from forgelm_tui.tui.attach import AttachedRun

    commands = ("request_cancel", "kill_now", "forward", "request_stacks")
    for target in (Session, Supervisor, AttachedRun, ScriptedRun):
        for name in commands:
            want = inspect.signature(getattr(Controls, name))
            got = inspect.signature(getattr(target, name))
            assert str(got) == str(want), f"{target.__name__}.{name}{got} is not {want}"
    used = "".join(path.read_text() for path in (PACKAGE / "tui").rglob("*.py"))
    assert "HANG_UP" not in used and "cause=" not in used  # views say what happened only
