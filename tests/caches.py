"""The module-level caches of the webhook, emptied between tests (tests/conftest.py): a memo one test
fills never answers for another, and a test that passes alone passes in any order."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterator
from typing import Any

# Memos kept in plain containers (or objects with an `entries` dict), by module. The functools caches
# need no list: every one defined at module level in webhook is found and cleared.
MEMOS: dict[str, tuple[str, ...]] = {
    "webhook.core.podspec.record": ("_PARSED",),
    "webhook.core.placement.fragmentation": ("_VECTORS", "_VALUES", "_HELD", "_STATES", "_CARDS", "_HOSTS"),
    "webhook.core.placement.group_place": ("_TABLES",),
    "webhook.core.admission.admit": ("_REQUIRED",),
}


def listed() -> Iterator[tuple[str, str, Any]]:
    """(module, name, container) of every memo in MEMOS; a name the module lacks is an error."""
    for module_name, names in MEMOS.items():
        module = importlib.import_module(module_name)
        for name in names:
            memo = getattr(module, name)  # AttributeError: the table above is out of date
            yield module_name, name, getattr(memo, "entries", memo)


def functools_caches() -> Iterator[Any]:
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("webhook.") or module is None:
            continue
        for value in vars(module).values():
            if isinstance(value, functools._lru_cache_wrapper) and value.__module__ == module_name:
                yield value


def reset() -> None:
    for _, _, memo in listed():
        memo.clear()
    for cached in functools_caches():
        cached.cache_clear()
