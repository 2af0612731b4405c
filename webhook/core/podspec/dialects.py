"""Other schedulers' pod annotations, read as HAMi and Volcano read them (KAI's: `kai.py`).

HAMi's `hami.io/gpu-scheduler-policy` is a comma list (pkg/scheduler/policy/gpu_policy.go,
util.PolicyContains): sort keys binpack, spread and numa in the order written, and two filters,
topology-aware (choose the best-linked set of GPUs) and mutex (only GPUs no task uses). The device
mode annotations (`nvidia.com/vgpu-mode`, `volcano.sh/vgpu-mode`) keep only devices whose mode
(hami-core, mig, mps) the value contains. Pure functions: each returns what it found and the warnings
to give, so the parser and the entry points can both use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.core.domain.names import GPU_PLACEMENTS
from webhook.core.domain.request import TopologyPreference

HAMI_NODE_POLICY = "hami.io/node-scheduler-policy"
HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
HAMI_NUMA_BIND = "nvidia.com/numa-bind"
# Device operating mode a pod asks for (HAMi and Volcano read it as a substring test against each device's mode).
VGPU_MODES: tuple[str, ...] = ("nvidia.com/vgpu-mode", "volcano.sh/vgpu-mode")
HAMI_POLICIES: frozenset[str] = frozenset(GPU_PLACEMENTS)
# hami.io/gpu-scheduler-policy: a comma list of sort keys (binpack, spread, numa) and filters (topology-aware,
# mutex), as HAMi's pkg/scheduler/policy and util.PolicyContains read it.
HAMI_GPU_POLICIES: frozenset[str] = frozenset({"binpack", "spread", "numa", "topology-aware", "mutex"})

MUTEX = "+mutex"  # suffix of a GPU policy: only GPUs no task uses (HAMi's mutex filter)
_SORT_KEYS = GPU_PLACEMENTS


class GpuPolicy(NamedTuple):
    """What the pod's gpu-scheduler-policy asks: the GPU policy inside a node (binpack or spread, with
    MUTEX appended when only unused GPUs may be taken; MUTEX alone: the default order; None: nothing
    asked) and a topology preference (None: not asked)."""

    placement: str | None
    topology: TopologyPreference | None
    warnings: tuple[str, ...]


_NO_POLICY = GpuPolicy(None, None, ())


def gpu_policy(annotations: Mapping[str, Any]) -> GpuPolicy:
    """hami.io/gpu-scheduler-policy as HAMi reads it; unknown parts are ignored with a warning (HAMi
    ignores them silently). The first of binpack/spread written decides the order; numa, a tie-break
    among equally used GPUs in HAMi, changes nothing here (GPUs are ranked by link topology)."""
    value = annotations.get(HAMI_GPU_POLICY)
    if value is None:
        return _NO_POLICY
    parts = [p.strip().lower() for p in value.split(",")] if isinstance(value, str) else []
    parts = [p for p in parts if p]
    unknown = [p for p in parts if p not in HAMI_GPU_POLICIES]
    warnings: tuple[str, ...] = ()
    if unknown or not parts:
        shown = ", ".join(unknown) if unknown else repr(value)
        warnings = (f"{HAMI_GPU_POLICY}: {shown} ignored (not binpack, spread, numa, topology-aware or mutex)",)
    sort = next((p for p in parts if p in _SORT_KEYS), "")
    placement = sort + MUTEX if "mutex" in parts else sort or None
    topology = TopologyPreference.PREFERRED if "topology-aware" in parts else None
    return GpuPolicy(placement, topology, warnings)


def resolve(placement: str | None, default: str) -> str | None:
    """The pod's GPU policy with the policy's default order filled in where it asked only for mutex."""
    return default.removesuffix(MUTEX) + MUTEX if placement == MUTEX else placement


def is_mutex(policy: str) -> bool:
    return policy.endswith(MUTEX)


def order_of(policy: str) -> str:
    return policy.removesuffix(MUTEX)


def numa_bind(annotations: Mapping[str, Any]) -> bool:
    """nvidia.com/numa-bind, parsed as Go's strconv.ParseBool (what HAMi uses)."""
    value = annotations.get(HAMI_NUMA_BIND)
    return isinstance(value, str) and value.strip() in ("1", "t", "T", "true", "TRUE", "True")


def mode_warnings(annotations: Mapping[str, Any], backend: str) -> list[str]:
    """Device-mode annotations that name a mode other than the namespace's enforcement backend. HAMi
    would leave such a pod pending (no device of that mode); here the backend's limits apply instead."""
    found: list[str] = []
    for key in VGPU_MODES:
        value = annotations.get(key)
        if value is None:
            continue
        text = value if isinstance(value, str) else ""
        if backend in ("hami-core", "mps") and backend in text:
            continue
        if backend == "none":
            found.append(f"annotation {key}={value!r}: this namespace sets no GPU limits; the slice is not enforced")
        else:
            found.append(f"annotation {key}={value!r}: limits are enforced with {backend} here")
    return found
