"""NVIDIA_VISIBLE_DEVICES=void: the explicit entry that shows a container no GPU, written by the mutation
and looked for by the validation.

The toolkit mounts no GPU for `void`, whatever else the image says (every CUDA base image sets
`NVIDIA_VISIBLE_DEVICES=all`), and the kubelet builds a container's environment from `envFrom` first and
`env` after, so the entry wins over any ConfigMap or Secret. It goes into every container that must see
no GPU: the containers of a GPU pod that get none (sidecars, `sidecar_ops`), every container of a pod
that asks for none but can reach a GPU node (`no_gpu_reach.py`) and ephemeral containers (`ephemeral.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core.domain.decision import Decision, denied, patched
from webhook.core.domain.model import PodRequest
from webhook.core.podspec.limits import NO_DEVICES
from webhook.core.podspec.patch import pointer
from webhook.core.podspec.vendors import list_of, mapping_of

from .envfrom import containers

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
VOID: Mapping[str, str] = {"name": VISIBLE, "value": NO_DEVICES}


def _has_void(container: Mapping[str, Any]) -> bool:
    return any(mapping_of(e).get("name") == VISIBLE and mapping_of(e).get("value") == NO_DEVICES
               for e in list_of(container.get("env")))


def void_ops(pod: Mapping[str, Any], targets: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    """`add` of each target container's whole env list with NVIDIA_VISIBLE_DEVICES=void appended (none for
    a container that has it already: a second pass yields no operations)."""
    spec = mapping_of(pod.get("spec"))
    ops: list[dict[str, Any]] = []
    for key, index in targets:
        items = list_of(spec.get(key))
        container = mapping_of(items[index]) if index < len(items) else {}
        if _has_void(container):
            continue
        existing = container.get("env")
        env = [*(existing if isinstance(existing, list) else []), dict(VOID)]
        ops.append({"op": "add", "path": pointer("spec", key, index, "env"), "value": env})
    return ops


def lacking(pod: Mapping[str, Any], targets: Iterable[tuple[str, int]]) -> list[str]:
    """How messages name each target container that lacks the entry."""
    spec = mapping_of(pod.get("spec"))
    labels = {(key, index): where for key, index, where, _ in
              containers(spec, ("containers", "initContainers", "ephemeralContainers"))}
    return [labels.get(t, str(t)) for t in targets if void_ops(pod, [t])]


def no_gpu_allowed(reason: str, message: str = "", ops: list[dict[str, Any]] | None = None,
                   warnings: tuple[str, ...] = ()) -> Decision:
    """Admit a pod (or containers) that gets no GPU, with these operations."""
    return patched(tuple(ops or ()), None, message, reason, warnings=warnings, gpu_pod=False)


def no_gpu_denied(code: int, reason: str, message: str) -> Decision:
    return denied(code, reason, message, gpu_pod=False)


# ------------------------------------------------------------------------------------------ sidecars


def sidecar_targets(request: PodRequest) -> list[tuple[str, int]]:
    """Containers of a GPU pod that get no GPU: on a GPU node, their image's NVIDIA_VISIBLE_DEVICES=all
    would show them every GPU of the node."""
    spec = mapping_of(request.raw.get("spec"))
    targets = []
    for c in request.containers:
        key = "initContainers" if c.init else "containers"
        items = list_of(spec.get(key))
        raw = mapping_of(items[c.index]) if c.index < len(items) else {}
        if (c.gpu is None or c.gpu.count <= 0) and not mapping_of(raw.get("resources")).get("claims"):
            targets.append((key, c.index))  # a container using a DRA claim gets its GPUs through CDI
    return targets


def sidecar_ops(pod: Mapping[str, Any], request: PodRequest) -> list[dict[str, Any]]:
    return void_ops(pod, sidecar_targets(request))


def missing_sidecar_void(pod: Mapping[str, Any], request: PodRequest) -> str | None:
    found = lacking(pod, sidecar_targets(request))
    if not found:
        return None
    return (f"{found[0]} asks for no GPU and lacks {VISIBLE}={NO_DEVICES} that the mutating webhook writes: "
            "another webhook removed it; resubmit the pod")
