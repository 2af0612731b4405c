"""Other schedulers' pod annotations, read as HAMi, Volcano and KAI read them.

HAMi's `hami.io/gpu-scheduler-policy` is a comma list (pkg/scheduler/policy/gpu_policy.go,
util.PolicyContains): sort keys binpack, spread and numa in the order written, and two filters,
topology-aware (choose the best-linked set of GPUs) and mutex (only GPUs no task uses). The device
mode annotations (`nvidia.com/vgpu-mode`, `volcano.sh/vgpu-mode`) keep only devices whose mode
(hami-core, mig, mps) the value contains. Pure functions: each returns what it found and the warnings
to give, so the parser and the entry points can both use them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from webhook.core.domain.model import TopologyPreference
from webhook.core.domain.names import GPU_PLACEMENTS

from .vendors import (
    HAMI_GPU_POLICIES,
    HAMI_GPU_POLICY,
    HAMI_NUMA_BIND,
    KAI_FRACTION,
    KAI_FRACTION_CONTAINER,
    KAI_MEMORY,
    VGPU_MODES,
)

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


# Argo's workflow controller puts this annotation on every pod it creates (workflowpod.go), and makes
# the pod's first container its executor, ahead of the step's `main`: `wait`, or `supervisor` in the
# opt-in init-less pod layout.
ARGO_NODE_NAME = "workflows.argoproj.io/node-name"
ARGO_EXECUTORS, ARGO_MAIN = ("wait", "supervisor"), "main"


class FractionTarget(NamedTuple):
    """The container a share asked by annotation belongs to: its position in the pod's containers as
    listed (app containers, then init containers), or None with the refusal to give."""

    position: int | None
    problem: str | None


def fraction_container(containers: Sequence[tuple[str, bool]], annotations: Mapping[str, Any]) -> FractionTarget:
    """Which container gets a `gpu-fraction` / `gpu-memory` share, as KAI-Scheduler's binder decides it
    (GetFractionContainerRef in pkg/binder/common/gpu_access.go; Run:ai's annotations are the same):
    the container `gpu-fraction-container-name` names, init containers looked at first, else
    `spec.containers[0]`. `containers` is (name, init) in the order above.

    An Argo pod's first container is Argo's executor (`wait`), so without the name the share would go
    to it and the step (`main`) would run without a GPU: refused, naming the annotation that fixes it."""
    name = annotations.get(KAI_FRACTION_CONTAINER)
    if name is None:
        first = next((i for i, (_, init) in enumerate(containers) if not init), None)
        if first is not None and ARGO_NODE_NAME in annotations and containers[first][0] in ARGO_EXECUTORS:
            return FractionTarget(None, (
                f"annotations {KAI_FRACTION}/{KAI_MEMORY} give the share to the pod's first container, which "
                f"Argo makes its {containers[first][0]!r} executor, so the step ({ARGO_MAIN!r}) would get no GPU; "
                f"add {KAI_FRACTION_CONTAINER}: {ARGO_MAIN} to the template's metadata.annotations"))
        return FractionTarget(first, None)
    for want_init in (True, False):
        for i, (have, init) in enumerate(containers):
            if init == want_init and have == name:
                return FractionTarget(i, None)
    return FractionTarget(None, (f"annotation {KAI_FRACTION_CONTAINER} is {name!r}, which names no container of "
                                 "the pod; write the name of the container that uses the GPU"))
