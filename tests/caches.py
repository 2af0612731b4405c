"""The module-level caches of the webhook, emptied between tests (tests/conftest.py): a memo one test
fills never answers for another, and a test that passes alone passes in any order."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import webhook

# Memos kept in plain containers (or objects with an `entries` dict), by module. The functools caches
# need no list: every one defined at module level in webhook is found and cleared.
MEMOS: dict[str, tuple[str, ...]] = {
    "webhook.core.podspec.record": ("_PARSED",),
    "webhook.core.placement.mixlearn": ("_HOSTS", "_MIXES"),
}

# Kind registries that compiled values index into: dropped as the module drops them when full (a new
# generation, so that anything compiled against the old indices re-indexes).
REGISTRIES: dict[str, tuple[str, ...]] = {
    "webhook.core.placement.kinds": ("REGISTRY",),
}

# Empty at import but no memo: shared empty mappings never written.
NOT_MEMOS: dict[str, tuple[str, ...]] = {
    "webhook.core.placement.nodereach": ("_NOTHING",),
    "webhook.core.placement.candidates": ("_NONE",),
}

_CONTAINERS = (dict, set, list, weakref.WeakKeyDictionary, weakref.WeakValueDictionary)


def listed() -> Iterator[tuple[str, str, Any]]:
    """(module, name, container) of every memo in MEMOS; a name the module lacks is an error."""
    for module_name, names in MEMOS.items():
        module = importlib.import_module(module_name)
        for name in names:
            memo = getattr(module, name)  # AttributeError: the table above is out of date
            yield module_name, name, getattr(memo, "entries", memo)


def registries() -> Iterator[Any]:
    for module_name, names in REGISTRIES.items():
        module = importlib.import_module(module_name)
        for name in names:
            yield getattr(module, name)  # AttributeError: the table above is out of date


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
    for registry in registries():
        registry.drop()
    for cached in functools_caches():
        cached.cache_clear()


def _held_dict(value: Any) -> dict[Any, Any] | None:
    """The dict a webhook-defined memo object keeps (`entries` or `indices`), if it is one."""
    kind = type(value)
    if not kind.__module__.startswith("webhook.") or isinstance(value, type) or callable(value):
        return None
    for attribute in ("entries", "indices"):
        try:
            held = object.__getattribute__(value, attribute)
        except AttributeError:
            continue
        if type(held) is dict:
            return held
    return None


def empty_at_import() -> list[str]:
    """`module.NAME` of every module-level container (or memo object) in webhook that is empty once
    imported: a memo, unless NOT_MEMOS says otherwise. Meaningful in a fresh interpreter only."""
    found: list[str] = []
    for info in pkgutil.walk_packages(webhook.__path__, "webhook."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("__"):
                continue
            kind = type(value)
            held = value if kind in _CONTAINERS else _held_dict(value)
            if held is not None and len(held) == 0:
                found.append(f"{info.name}.{name}")
    return sorted(set(found))


if __name__ == "__main__":
    print("\n".join(empty_at_import()))
