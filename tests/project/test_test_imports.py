"""No test module imports another: what tests share lives in the support modules beside them (tests/*.py)
and in conftest.py fixtures, so running one test folder never depends on another's test files."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_test_module_imports_another() -> None:
    offenders = {
        f"{path.relative_to(TESTS)}: {name}"
        for path in TESTS.rglob("*.py")
        for name in imported(path)
        if name.startswith("tests.") or name.split(".")[-1].startswith("test_") or ".test_" in name
    }
    assert sorted(offenders) == []
