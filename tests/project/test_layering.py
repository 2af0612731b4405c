"""The allocation core stays pure: standard library only (the import-linter contracts cover the rest)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from check_core_imports import offending_imports


def test_core_imports_only_the_standard_library() -> None:
    assert offending_imports() == []


def test_the_check_catches_a_third_party_import(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        textwrap.dedent("""
        import json
        from yaml import safe_load
        from . import model
    """)
    )
    found = offending_imports(tmp_path)
    assert len(found) == 1 and found[0].endswith("imports yaml")
