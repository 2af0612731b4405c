"""A container's `env` entries as the parser reads them: the limits this webhook wrote, and the variables
that bypass isolation when a container sets them itself (the table of those is `limits.py`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .coerce import is_mapping, list_of, mapping_of
from .limits import GPU_POD_ONLY_ENV, NO_DEVICES, is_isolation_env, is_pin

# Variables the mutating webhook writes (hami-core and MPS backends).
_LIMIT_ENV = re.compile(
    r"CUDA_DEVICE_MEMORY_LIMIT_[0-9]+|CUDA_DEVICE_SM_LIMIT(_[0-9]+)?|"
    r"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE|CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)


def is_limit_env(name: str) -> bool:
    """A variable the mutating webhook writes to enforce limits."""
    return _LIMIT_ENV.fullmatch(name) is not None


def is_bypass_env(name: str) -> bool:
    """A variable that widens or unlimits device access when a container sets it itself (the table in
    `limits`), in any pod; LD_PRELOAD only matters in a GPU pod."""
    return is_isolation_env(name) and name not in GPU_POD_ONLY_ENV


def is_bypass_entry(entry: object) -> bool:
    """An `env` entry that sets a bypass variable; `NVIDIA_VISIBLE_DEVICES=void` (no GPU at all, what
    the webhook itself writes into containers that must see none) is not one."""
    name = mapping_of(entry).get("name")
    if not isinstance(name, str) or not is_bypass_env(name) or is_pin(name, mapping_of(entry)):
        return False  # a pin: a switch set to its safe value over an unread envFrom source (limits.py)
    return not (name == "NVIDIA_VISIBLE_DEVICES" and mapping_of(entry).get("value") == NO_DEVICES)


def limit_env_of(container: Mapping[str, Any]) -> dict[str, str]:
    """The enforcement variables a container carries with a literal value (what our patch writes)."""
    found: dict[str, str] = {}
    for entry in list_of(container.get("env")):
        if is_mapping(entry):
            name, value = entry.get("name"), entry.get("value")
            if isinstance(name, str) and isinstance(value, str) and is_limit_env(name):
                found[name] = value
    return found
