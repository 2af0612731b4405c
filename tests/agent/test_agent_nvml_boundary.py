"""pynvml stays behind one module, and only when the agent runs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_nvml_module_imports_pynvml() -> None:
    importers = sorted(
        str(path.relative_to(ROOT)) for path in (ROOT / "webhook").rglob("*.py") if "pynvml" in imported_modules(path)
    )
    assert importers == ["webhook/agent/nvml.py"]


def test_loading_the_agent_command_imports_no_heavy_library() -> None:
    script = (
        "import sys, argparse, webhook.commands.agent as m; m.add_arguments(argparse.ArgumentParser()); "
        "print(sorted(n for n in ('pynvml', 'kubernetes', 'prometheus_client') if n in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "[]", "")
