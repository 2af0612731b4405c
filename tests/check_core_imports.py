"""Fails when webhook/core imports anything outside the standard library and webhook.core itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "webhook" / "core"


def offending_imports(root: Path = CORE) -> list[str]:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    problems = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] not in allowed and not (name + ".").startswith("webhook.core."):
                    problems.append(f"{path.relative_to(root.parent.parent)}:{node.lineno}: imports {name}")
    return problems


if __name__ == "__main__":
    found = offending_imports()
    print("\n".join(found) or "webhook/core imports only the standard library")
    sys.exit(1 if found else 0)
