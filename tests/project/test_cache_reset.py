"""The cache reset between tests knows every memo it claims to, finds every one the webhook has, and
empties them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import caches

from webhook.core.placement import kinds
from webhook.core.podspec import record


def test_every_listed_memo_exists_and_can_be_emptied() -> None:
    found = list(caches.listed())
    assert len(found) == sum(len(names) for names in caches.MEMOS.values())
    assert all(hasattr(memo, "clear") for _, _, memo in found)
    assert all(isinstance(r.indices, dict) for r in caches.registries())


def test_every_memo_the_webhook_has_is_listed() -> None:
    # A fresh interpreter: there a module-level container still empty after import is a memo (a
    # constant table is filled when written). A new or renamed memo fails here until the table says so.
    script = Path(caches.__file__)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                         cwd=script.parent.parent).stdout.split()
    known = {f"{module}.{name}" for table in (caches.MEMOS, caches.REGISTRIES, caches.NOT_MEMOS)
             for module, names in table.items() for name in names}
    assert sorted(set(out) - known) == []
    assert sorted(known - set(out)) == []


def test_reset_empties_memos_and_functools_caches() -> None:
    assert any(c.__module__ == "webhook.core.podspec.record" for c in caches.functools_caches())
    record._PARSED[(0, "x")] = None  # type: ignore[assignment]
    kinds.REGISTRY.index((1, 2, 3, 4, 5, ("x",)))  # type: ignore[arg-type]
    generation = kinds.REGISTRY.generation
    caches.reset()
    assert record._PARSED == {}
    assert kinds.REGISTRY.indices == {}
    assert kinds.REGISTRY.generation == generation + 1
    assert all(c.cache_info().currsize == 0 for c in caches.functools_caches())
