"""Fields of decoded JSON read as the types they should have: a mapping, a list, a pod's containers.

Nothing here raises on a field of the wrong type: it reads as empty (`podshape.py` says what is wrong,
before parsing). `is_mapping` and `mapping_of` answer plain dicts and None first, for speed: the ABC
check costs ten times more, and parsing a pod makes dozens of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """isinstance(value, Mapping), answering plain dicts and None (what decoded JSON holds) first."""
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def mapping_of(value: object) -> Mapping[str, Any]:
    if type(value) is dict or (value is not None and isinstance(value, Mapping)):  # as is_mapping, inlined
        return value
    return {}


def list_of(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def containers_of(spec: Mapping[str, Any]) -> list[tuple[bool, int, Mapping[str, Any]]]:
    """(init, index, container) for the app containers, then the init containers."""
    out: list[tuple[bool, int, Mapping[str, Any]]] = []
    for init, key in ((False, "containers"), (True, "initContainers")):
        for index, container in enumerate(list_of(spec.get(key))):
            out.append((init, index, mapping_of(container)))
    return out
