"""Routes to a GPU that the NVIDIA container toolkit on the node opens or closes.

The toolkit takes a container's device list from NVIDIA_VISIBLE_DEVICES (unless the node sets
`accept-nvidia-visible-devices-envvar-when-unprivileged = false`, which only the node can do), and,
where `accept-nvidia-visible-devices-as-volume-mounts = true` (the setting that goes with it, for the
device plugin's `volume-mounts` strategy), from bind mounts of /dev/null at
/var/run/nvidia-container-devices/<id>. A pod can write such a mount itself (a hostPath /dev/null
volume): that route is refused here on every node. The agent reports each node's setting
(GPUInventory `toolkit`, `Node.toolkit_envvar`); a GPU pod pinned to a node that still honours the
variable is told so in a warning.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from typing import Any

from webhook.core.domain.model import Snapshot
from webhook.core.domain.podview import PodView
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.coerce import list_of, mapping_of
from webhook.core.podspec.view import view_for

DEVICE_LIST_ROOTS = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
HOSTNAME_LABEL = "kubernetes.io/hostname"
_KINDS = (("containers", "container"), ("initContainers", "init container"),
          ("ephemeralContainers", "ephemeral container"))
_LABELS = dict(_KINDS)


def _mounts(pod: Mapping[str, Any] | PodView) -> Iterator[tuple[str, object, int, str]]:
    """(container kind, its name, its index, mount path) of every volume mount of every container kind.
    A view is read as it is; a raw pod (the server's test of a pod it has not parsed) is walked."""
    if isinstance(pod, PodView):
        for c in pod.containers:
            for mount in c.volume_mounts:
                path = mount.get("mountPath")
                if isinstance(path, str):
                    yield _LABELS[c.kind], c.name, c.index, path
        return
    spec = mapping_of(pod.get("spec"))
    for key, kind in _KINDS:
        for index, raw in enumerate(list_of(spec.get(key))):
            container = mapping_of(raw)
            for mount in list_of(container.get("volumeMounts")):
                path = mapping_of(mount).get("mountPath")
                if isinstance(path, str):
                    yield kind, container.get("name"), index, path


def _label(kind: str, name: object, index: int) -> str:
    return f"{kind} {name!r}" if isinstance(name, str) and name else f"{kind} #{index}"


def _clean(path: str) -> str:
    return posixpath.normpath("/" + path.lstrip("/"))


def _reads_device_list(path: str) -> bool:
    if "nvidia-container-devices" not in path:  # the usual mount: one substring test, no path normalising
        return False
    clean = _clean(path)
    return any(clean == root or clean.startswith(root + "/") for root in DEVICE_LIST_ROOTS)


def device_list_mounts(pod: Mapping[str, Any] | PodView) -> list[str]:
    """"<container> mounts <path>" for every volume mount where the toolkit reads a device list."""
    return [f"{_label(kind, c, i)} mounts {path}" for kind, c, i, path in _mounts(pod) if _reads_device_list(path)]


# Where the limit layer is put into a GPU container: HAMi's device plugin bind-mounts libvgpu.so under
# /usr/local/vgpu and /etc/ld.so.preload, which makes the loader inject it. The kubelet adds the pod's
# own volume mounts after the device plugin's, so a volume the pod mounts at one of these paths, or at a
# directory holding one (/etc, /usr/local), lands on top and the limits are never loaded.
LIMIT_LAYER_PATHS = ("/etc/ld.so.preload", "/usr/local/vgpu")


def limit_layer_mounts(pod: Mapping[str, Any] | PodView) -> list[str]:
    """"<container> mounts <path>" for every volume mount that covers where the limit layer is injected."""
    return [f"{_label(kind, c, i)} mounts a volume at {path}" for kind, c, i, path in _mounts(pod)
            if _covers_limit_layer(path)]


def _covers_limit_layer(path: str) -> bool:
    clean = _clean(path)
    return any(clean == guarded or guarded.startswith(clean.rstrip("/") + "/") or clean.startswith(guarded + "/")
               for guarded in LIMIT_LAYER_PATHS)


def pinned_nodes(pod: Mapping[str, Any] | PodView) -> tuple[str, ...]:
    """The nodes a pod is pinned to by name: spec.nodeName, a kubernetes.io/hostname nodeSelector, or a
    required node affinity whose every term names hosts (() when it is not pinned that way)."""
    if isinstance(pod, PodView):
        node_name: object = pod.node_name
        selector, affinity = pod.node_selector, pod.affinity
    else:
        spec = mapping_of(pod.get("spec"))
        node_name = spec.get("nodeName")
        selector, affinity = mapping_of(spec.get("nodeSelector")), mapping_of(spec.get("affinity"))
    if isinstance(node_name, str) and node_name:
        return (node_name,)
    host = selector.get(HOSTNAME_LABEL)
    if isinstance(host, str) and host:
        return (host,)
    required = mapping_of(mapping_of(affinity.get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    names: list[str] = []
    terms = list_of(required.get("nodeSelectorTerms"))
    for term in terms:
        named = [
            v for field, key in (("matchExpressions", HOSTNAME_LABEL), ("matchFields", "metadata.name"))
            for e in list_of(mapping_of(term).get(field))
            if mapping_of(e).get("key") == key and mapping_of(e).get("operator") == "In"
            for v in list_of(mapping_of(e).get("values")) if isinstance(v, str)
        ]
        if not named:
            return ()  # one term that names no host: the pod may go elsewhere
        names.extend(n for n in named if n not in names)
    return tuple(names)


def _first_mounts(view: PodView, gpu_pod: bool) -> tuple[str | None, str | None]:
    """One pass over the pod's mounts: the first that reads a device list, and, in a GPU pod, the first
    that covers the limit layer ("<container> mounts ...", None when there is none)."""
    device_list = limit_layer = None
    for kind, name, index, path in _mounts(view):
        if device_list is None and _reads_device_list(path):
            device_list = f"{_label(kind, name, index)} mounts {path}"
        if gpu_pod and limit_layer is None and _covers_limit_layer(path):
            limit_layer = f"{_label(kind, name, index)} mounts a volume at {path}"
    return device_list, limit_layer


def screen(request: PodRequest, snapshot: Snapshot) -> PodRequest:
    """`request` with a device-list mount refused, and, for a GPU pod pinned to nodes whose toolkit
    honours NVIDIA_VISIBLE_DEVICES from unprivileged containers, a warning that says so."""
    view = view_for(request)
    mount, covered = _first_mounts(view, request.is_gpu_pod)
    if mount:
        violation = Refusal(
            "isolation-device-mount", 403,
            f"{mount}, where the NVIDIA container toolkit reads the GPUs to give a container: remove "
            "that volume mount and ask for GPUs in resources.limits (e.g. nvidia.com/gpu: 1)")
        return request.evolve(is_gpu_pod=True, violations=(*request.violations, violation))
    if not request.is_gpu_pod:
        return request
    if covered:
        violation = Refusal(
            "isolation-limit-mount", 403,
            f"{covered}, which covers where the GPU limit layer is put into the container "
            f"({' and '.join(LIMIT_LAYER_PATHS)}): mount the volume elsewhere")
        return request.evolve(violations=(*request.violations, violation))
    if not snapshot.nodes:
        return request
    pinned = pinned_nodes(view)
    open_nodes = [n for n in pinned if (node := snapshot.nodes.get(n)) is not None and node.toolkit_envvar is True]
    if not open_nodes:
        return request
    warning = (f"node {open_nodes[0]}: its NVIDIA toolkit honours NVIDIA_VISIBLE_DEVICES in unprivileged "
               "containers (docs/install.md)")
    return request.evolve(warnings=(*request.warnings, warning))
