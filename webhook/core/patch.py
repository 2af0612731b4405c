"""JSONPatch operations that write a decision into a pod. Every operation is conditional on the pod's
current content, so applying the mutation to an already-mutated pod yields no operations.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .limits import limit_env
from .model import Allocation, ContainerRequest, PodRequest
from .record import ANNOTATION, allocation_to_json

MANAGED_LABEL = "gpu-admission.io/managed"
Op = dict[str, Any]


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON pointer from raw path parts (escapes '~' and '/')."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _list_of(container: Mapping[str, Any], key: str) -> list[Any]:
    value = container.get(key)
    return value if isinstance(value, list) else []


def _container(pod: Mapping[str, Any], c: ContainerRequest) -> Mapping[str, Any]:
    spec = pod.get("spec") or {}
    items = spec.get("initContainers" if c.init else "containers") or []
    return items[c.index] if c.index < len(items) and isinstance(items[c.index], Mapping) else {}


def env_ops(pod: Mapping[str, Any], request: PodRequest, allocation: Allocation, backend: str) -> list[Op]:
    """Backend limit variables for every container that asks for GPUs."""
    ops: list[Op] = []
    for c in request.containers:
        if c.gpu is None or c.gpu.count <= 0:
            continue
        container = _container(pod, c)
        base = ("spec", "initContainers" if c.init else "containers", c.index)
        wanted = limit_env(backend, c.gpu.count, allocation.memory_mib, allocation.cores)
        existing = _list_of(container, "env")
        have = {e.get("name"): e.get("value") for e in existing if isinstance(e, Mapping)}
        missing = [{"name": n, "value": v} for n, v in wanted if have.get(n) != v]
        if not missing:
            continue
        if "env" not in container or not isinstance(container.get("env"), list):
            ops.append({"op": "add", "path": pointer(*base, "env"), "value": missing})
        else:
            ops.extend({"op": "add", "path": pointer(*base, "env", "-"), "value": e} for e in missing)
    return ops


def resource_ops(pod: Mapping[str, Any], request: PodRequest, count_resource: Mapping[str, str]) -> list[Op]:
    """Move memory/compute slices out of `resources` (no node advertises them) and make sure the
    device count is there for the device plugin (`nvidia.com/gpu: 1` when only memory/cores were given)."""
    ops: list[Op] = []
    for c in request.containers:
        container = _container(pod, c)
        resources = container.get("resources") if isinstance(container.get("resources"), Mapping) else {}
        base = ("spec", "initContainers" if c.init else "containers", c.index, "resources")
        for section in ("limits", "requests"):
            values = resources.get(section) if isinstance(resources.get(section), Mapping) else {}
            ops.extend(
                {"op": "remove", "path": pointer(*base, section, name)} for name in c.moved_resources if name in values
            )
        if c.gpu is None or c.gpu.count <= 0 or not c.moved_resources:
            continue
        count_name = count_resource.get(c.gpu.vendor)
        limits = resources.get("limits") if isinstance(resources.get("limits"), Mapping) else None
        if count_name is None or (limits is not None and count_name in limits):
            continue
        value = str(c.gpu.count)
        if not resources:
            ops.append({"op": "add", "path": pointer(*base), "value": {"limits": {count_name: value}}})
        elif limits is None:
            ops.append({"op": "add", "path": pointer(*base, "limits"), "value": {count_name: value}})
        else:
            ops.append({"op": "add", "path": pointer(*base, "limits", count_name), "value": value})
    return ops


def toleration_ops(pod: Mapping[str, Any], wanted: list[Mapping[str, Any]]) -> list[Op]:
    """Add each wanted toleration unless an identical one (or an Exists on the same key) is there."""
    spec = pod.get("spec") or {}
    existing = spec.get("tolerations") if isinstance(spec.get("tolerations"), list) else None
    have = [t for t in existing or [] if isinstance(t, Mapping)]

    def covered(tol: Mapping[str, Any]) -> bool:
        for t in have:
            same_key = t.get("key") == tol.get("key") or (not t.get("key") and t.get("operator") == "Exists")
            same_effect = not t.get("effect") or t.get("effect") == tol.get("effect")
            if same_key and same_effect and (t.get("operator") == "Exists" or t.get("value") == tol.get("value")):
                return True
        return False

    missing: list[Mapping[str, Any]] = []
    for tol in wanted:
        if not covered(tol) and tol not in missing:
            missing.append(dict(tol))
    if not missing:
        return []
    if existing is None:
        return [{"op": "add", "path": "/spec/tolerations", "value": missing}]
    return [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing]


def affinity_ops(pod: Mapping[str, Any], required: Mapping[str, Any], preferred: list[str]) -> list[Op]:
    """AND `required` (a node selector requirement) into every existing required term, and add
    preferred terms ranking `preferred` nodes (best first)."""
    spec = pod.get("spec") or {}
    affinity = spec.get("affinity") if isinstance(spec.get("affinity"), Mapping) else None
    node_aff = (affinity or {}).get("nodeAffinity") if isinstance((affinity or {}).get("nodeAffinity"), Mapping) else None
    req_key = "requiredDuringSchedulingIgnoredDuringExecution"
    pref_key = "preferredDuringSchedulingIgnoredDuringExecution"
    field = "matchFields" if required.get("key") == "metadata.name" else "matchExpressions"
    pref_terms = [
        {"weight": max(100 - 10 * i, 1), "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [name]}]}}
        for i, name in enumerate(preferred)
    ]
    if node_aff is None:
        value: dict[str, Any] = {req_key: {"nodeSelectorTerms": [{field: [dict(required)]}]}}
        if pref_terms:
            value[pref_key] = pref_terms
        if affinity is None:
            return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": value}}]
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": value}]
    ops: list[Op] = []
    base = ("spec", "affinity", "nodeAffinity")
    selector = node_aff.get(req_key) if isinstance(node_aff.get(req_key), Mapping) else None
    terms = selector.get("nodeSelectorTerms") if selector and isinstance(selector.get("nodeSelectorTerms"), list) else None
    if not terms:
        ops.append({"op": "add", "path": pointer(*base, req_key), "value": {"nodeSelectorTerms": [{field: [dict(required)]}]}})
    else:
        for i, term in enumerate(terms):
            term = term if isinstance(term, Mapping) else {}
            items = term.get(field)
            if isinstance(items, list):
                if dict(required) not in items:
                    ops.append({"op": "add", "path": pointer(*base, req_key, "nodeSelectorTerms", i, field, "-"),
                                "value": dict(required)})
            else:
                ops.append({"op": "add", "path": pointer(*base, req_key, "nodeSelectorTerms", i, field),
                            "value": [dict(required)]})
    if pref_terms:
        existing = node_aff.get(pref_key)
        if isinstance(existing, list):
            ops.extend({"op": "add", "path": pointer(*base, pref_key, "-"), "value": t} for t in pref_terms if t not in existing)
        else:
            ops.append({"op": "add", "path": pointer(*base, pref_key), "value": pref_terms})
    return ops


def record_ops(pod: Mapping[str, Any], allocation: Allocation) -> list[Op]:
    """The decision annotation and the managed label."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    ops: list[Op] = []
    annotations = meta.get("annotations")
    value = json.dumps(allocation_to_json(allocation), separators=(",", ":"), sort_keys=True)
    if not isinstance(annotations, Mapping):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: value}})
    elif annotations.get(ANNOTATION) != value:
        ops.append({"op": "add", "path": pointer("metadata", "annotations", ANNOTATION), "value": value})
    labels = meta.get("labels")
    if not isinstance(labels, Mapping):
        ops.append({"op": "add", "path": "/metadata/labels", "value": {MANAGED_LABEL: "true"}})
    elif labels.get(MANAGED_LABEL) != "true":
        ops.append({"op": "add", "path": pointer("metadata", "labels", MANAGED_LABEL), "value": "true"})
    return ops
