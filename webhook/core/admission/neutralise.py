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
from webhook.core.domain.podview import ContainerView, PodView
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.limits import NO_DEVICES
from webhook.core.podspec.patch import pointer
from webhook.core.podspec.view import as_view, view_for

from .envfrom import named

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
VOID: Mapping[str, str] = {"name": VISIBLE, "value": NO_DEVICES}


def _has_void(container: ContainerView | None) -> bool:
    return container is not None and any(e.get("name") == VISIBLE and e.get("value") == NO_DEVICES
                                         for e in container.env)


def void_ops(pod: Mapping[str, Any] | PodView, targets: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    """`add` of each target container's whole env list with NVIDIA_VISIBLE_DEVICES=void appended (none for
    a container that has it already: a second pass yields no operations)."""
    view = as_view(pod)
    ops: list[dict[str, Any]] = []
    for key, index in targets:
        container = view.container(key, index)
        if _has_void(container):
            continue
        env = [*(container.env if container is not None else ()), dict(VOID)]
        ops.append({"op": "add", "path": pointer("spec", key, index, "env"), "value": env})
    return ops


def lacking(pod: Mapping[str, Any] | PodView, targets: Iterable[tuple[str, int]]) -> list[str]:
    """How messages name each target container that lacks the entry."""
    view = as_view(pod)
    return [named(key, index, c.name if c is not None else "") for key, index in targets
            if not _has_void(c := view.container(key, index))]


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
    view = view_for(request)
    targets = []
    for c in request.containers:
        key = "initContainers" if c.init else "containers"
        container = view.container(key, c.index)
        if (c.gpu is None or c.gpu.count <= 0) and not (container is not None and container.claims):
            targets.append((key, c.index))  # a container using a DRA claim gets its GPUs through CDI
    return targets


def sidecar_ops(request: PodRequest) -> list[dict[str, Any]]:
    return void_ops(view_for(request), sidecar_targets(request))


def missing_sidecar_void(request: PodRequest) -> str | None:
    found = lacking(view_for(request), sidecar_targets(request))
    if not found:
        return None
    return (f"{found[0]} asks for no GPU and lacks {VISIBLE}={NO_DEVICES} that the mutating webhook writes: "
            "another webhook removed it; resubmit the pod")
