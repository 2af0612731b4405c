"""What each enforcement backend reads inside the container, as environment variables.

hami-core (libvgpu.so) reads CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT; the CUDA MPS
client reads CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
"""

from __future__ import annotations

import re
from functools import lru_cache

BACKEND_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
_MEMORY_VAR = re.compile(r"^CUDA_DEVICE_MEMORY_LIMIT(_\d+)?$")


@lru_cache(maxsize=512)
def limit_env(backend: str, gpus: int, memory_mib: int, cores: int) -> tuple[tuple[str, str], ...]:
    """The (name, value) pairs a container with `gpus` devices of `memory_mib` and `cores` % each gets.
    Memoised: every admission asks, and a cluster has few distinct slices."""
    if backend == "none" or gpus <= 0:
        return ()
    if backend == "hami-core":
        env = [(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", f"{memory_mib}m") for i in range(gpus)]
        if cores < 100:  # 0 too, as HAMi's device plugin writes it: HAMi-core reads 0 as no compute cap
            env.append(("CUDA_DEVICE_SM_LIMIT", str(cores)))
        return tuple(env)
    if backend == "mps":
        pinned = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ",".join(f"{i}={memory_mib}M" for i in range(gpus)))
        if cores == 0:  # best effort: no percentage, so the client may use every SM
            return (pinned,)
        return ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(cores)), pinned
    raise ValueError(f"unknown enforcement backend {backend!r}")


def is_limit_env(name: str) -> bool:
    """True for the variables this product writes (a user must not set them)."""
    return bool(_MEMORY_VAR.match(name)) or name in BACKEND_PREFIXES[1:]
