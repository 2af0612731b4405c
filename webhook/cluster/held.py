"""What a running or pending pod really holds of each GPU, read only from fields its owner cannot edit.

A pod's container `env` and its extended resources cannot change after creation (in-place resize covers
cpu and memory only), while any annotation can. So the slice of each GPU is read from the limit
variables the mutation wrote into the env, which are also what the limit layer enforces: HAMi-core's
`CUDA_DEVICE_MEMORY_LIMIT[_<i>]` and `CUDA_DEVICE_SM_LIMIT`, the MPS client's
`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`. A GPU container with no
such limit can use whole cards and is counted so. The decision annotation is never read for amounts, nor
are KAI's share annotations: a kai-scheduler pod, which gets no device count, counts the devices its
per-device limit variables cover.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, NamedTuple

from webhook.core.domain.request import ContainerRequest, PodRequest
from webhook.core.podspec.coerce import is_mapping, list_of, mapping_of
from webhook.core.podspec.kai import KAI_FRACTION, KAI_FRACTION_DEVICES, KAI_MEMORY
from webhook.core.podspec.vendor_table import MAX_GPUS

KAI_SHARE = (KAI_FRACTION, KAI_MEMORY, KAI_FRACTION_DEVICES)

HAMI_MEMORY = "CUDA_DEVICE_MEMORY_LIMIT"
HAMI_CORES = "CUDA_DEVICE_SM_LIMIT"
MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_CORES = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
_PREFIXES = (HAMI_MEMORY, HAMI_CORES, MPS_MEMORY, MPS_CORES)


class Held(NamedTuple):
    """Per GPU: memory in MiB (None: the whole card) and compute in percent."""

    memory_mib: int | None
    cores: int


_UNITS = {"k": 1 / 1024, "m": 1, "g": 1024}


def limit_mib(value: str | None) -> int | None:
    """A memory limit as HAMi-core reads it (`3000m`, `3g`, `1024k`, or bytes) in MiB, rounded up;
    None when absent, zero (HAMi-core: no limit) or unreadable (the limit layer would not cap it)."""
    if value is None:
        return None
    text = value.strip().lower()
    unit = _UNITS.get(text[-1:])
    digits = text[:-1] if unit is not None else text
    if not digits.isdigit() or len(digits) > 15:
        return None
    amount = int(digits) * unit if unit is not None else int(digits) / (1024 * 1024)
    return -int(-amount // 1) or None


def _percent(value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        return 100  # unreadable: the limit layer does not cap it
    return number if 0 <= number <= 100 else 100


def _container(env: dict[str, str], count: int) -> Held | None:
    """The container's slice from its limit variables; None when it carries none."""
    if MPS_MEMORY in env or MPS_CORES in env:
        pinned: dict[str, int | None] = {}
        for part in env.get(MPS_MEMORY, "").split(","):
            index, _, amount = part.partition("=")
            pinned[index.strip()] = limit_mib(amount)
        per_gpu = [pinned.get(str(i)) for i in range(count)]
        memory = None if None in per_gpu or not per_gpu else max(m for m in per_gpu if m is not None)
        return Held(memory, _percent(env.get(MPS_CORES), 0))  # left out only for best effort (limits.py)
    names = [f"{HAMI_MEMORY}_{i}" for i in range(count)]
    if not any(n in env for n in names) and HAMI_MEMORY not in env and HAMI_CORES not in env:
        return None
    limits = [limit_mib(env.get(n, env.get(HAMI_MEMORY))) for n in names]
    memory = None if None in limits or not limits else max(m for m in limits if m is not None)
    return Held(memory, _percent(env.get(HAMI_CORES), 100))


def held_of(request: PodRequest) -> Held | None:
    """The pod's per-GPU slice from its containers' limit variables: the largest any of its GPU containers
    may use. None when no GPU container carries a limit variable (then its resources say what it asked)."""
    found: list[Held] = []
    unlimited = False
    for c in request.containers:
        if c.gpu is None or c.gpu.count <= 0:
            continue
        held = _container(_limit_env(_raw_container(request, c)), c.gpu.count)
        if held is None:
            unlimited = True
        else:
            found.append(held)
    if not found:
        return None
    if unlimited or any(h.memory_mib is None for h in found):
        return Held(None, max(100, *(h.cores for h in found)))
    return Held(max(h.memory_mib for h in found if h.memory_mib is not None), max(h.cores for h in found))


def _limit_env(container: dict[str, object]) -> dict[str, str]:
    """The container's limit variables (the last of a repeated name wins, as in the container); one set
    from a ConfigMap, a Secret or a field is unknown here and reads as no limit."""
    found: dict[str, str] = {}
    for entry in list_of(container.get("env")):
        name = entry.get("name") if is_mapping(entry) else None
        if isinstance(name, str) and name.startswith(_PREFIXES):
            value = entry.get("value")
            found[name] = value if isinstance(value, str) and "valueFrom" not in entry else ""
    return found


def _raw_container(request: PodRequest, c: ContainerRequest) -> dict[str, object]:
    spec = request.raw.get("spec") if isinstance(request.raw, dict) else None
    items = spec.get("initContainers" if c.init else "containers") if isinstance(spec, dict) else None
    item = items[c.index] if isinstance(items, list) and c.index < len(items) else None
    return item if isinstance(item, dict) else {}


def without_share_annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod without KAI's gpu-fraction / gpu-memory annotations, which its owner can edit or remove
    on a running pod: accounting must not read them (the pod itself when it has none)."""
    metadata = mapping_of(pod.get("metadata"))
    annotations = mapping_of(metadata.get("annotations"))
    if not any(k in annotations for k in KAI_SHARE):
        return pod
    kept = {k: v for k, v in annotations.items() if k not in KAI_SHARE}
    return {**pod, "metadata": {**metadata, "annotations": kept}}


def env_share_of(request: PodRequest) -> tuple[int, Held] | None:
    """GPUs recorded only in a container's per-device limit variables (`CUDA_DEVICE_MEMORY_LIMIT_<i>`,
    or the indices of `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`): a share asked by KAI annotation for
    kai-scheduler, which gets no device count in resources (KAI would read it as whole GPUs). The count is
    the number of devices the variables cover, the slice theirs; None when no container has any."""
    best: tuple[int, Held] | None = None
    for c in request.containers:
        env = _limit_env(_raw_container(request, c))
        indices = {int(n[len(HAMI_MEMORY) + 1:]) for n in env
                   if n.startswith(HAMI_MEMORY + "_") and n[len(HAMI_MEMORY) + 1:].isdigit()}
        for part in env.get(MPS_MEMORY, "").split(","):
            index = part.partition("=")[0].strip()
            if index.isdigit():
                indices.add(int(index))
        count = max(indices) + 1 if indices and max(indices) < MAX_GPUS else 0
        held = _container(env, count) if count else None
        if held is not None and (best is None or count > best[0]):
            best = (count, held)
    return best


def record_nonce(raw: object) -> str:
    """The nonce of a decision record ("" when it has none or does not parse): unique per admission,
    so two pods presenting one are a copy (core/record.py)."""
    if not isinstance(raw, str) or '"nonce"' not in raw:
        return ""
    try:
        nonce = json.loads(raw).get("nonce")
    except (ValueError, AttributeError, RecursionError):
        return ""
    return nonce if isinstance(nonce, str) else ""


def repeated(keys: Iterable[Hashable]) -> frozenset[Hashable]:
    """The keys seen more than once: (node, nonce) pairs of records that two held pods present. Neither
    pod's GPU indices are trusted then: both are charged, after every trusted pod, to the freest GPUs of
    their node, so a replayed record takes real free capacity instead of freeing the GPU in use."""
    seen: set[Hashable] = set()
    twice: set[Hashable] = set()
    for key in keys:
        (twice if key in seen else seen).add(key)
    return frozenset(twice)
