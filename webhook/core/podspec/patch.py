"""JSONPatch operations that write a decision into a pod.

Every operation is an `add` of a whole value (RFC 6902 `add` replaces an existing member), computed
from the pod's current content. So the patch is idempotent twice over: applying it a second time
changes nothing, and mutating an already-mutated pod yields no operations at all.

A value is a new container at every level this module changes, and shares the members it leaves
alone (an existing toleration, an environment entry) with the pod: nothing modifies either once the
patch is made, and copying them cost more than the rest of the patch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from webhook.core.domain.model import Allocation
from webhook.core.domain.names import MANAGED_LABEL
from webhook.core.domain.podview import ContainerView, PodView, absent
from webhook.core.domain.request import ContainerRequest, PodRequest

from .coerce import is_mapping
from .coerce import mapping_of as _map
from .limits import limit_env
from .record import ANNOTATION, allocation_to_json
from .vendor_table import classify_resource, count_name_of, kept_for_scheduler
from .view import view_of

_NO_CONTAINER = view_of({"spec": {"containers": [{}]}}).containers[0]  # what a request names but the pod lacks

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
Op = dict[str, Any]
# Built once: json.dumps with options makes a new encoder on every call. Stateless, so shared safely.
_RECORD_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


@lru_cache(maxsize=1024)
def record_value(allocation: Allocation) -> str:
    """The annotation's text (canonical JSON). Memoised: the standard library's encoder costs more than
    the rest of the patch, and the same allocation recurs (a node's free GPUs, a re-invoked webhook)."""
    return _RECORD_JSON.encode(allocation_to_json(allocation))


@lru_cache(maxsize=512, typed=True)
def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON pointer from raw path parts (escapes '~' and '/'); memoised, since every
    mutation writes the same few paths."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def container_of(pod: PodView, c: ContainerRequest) -> ContainerView:
    """The view of the container (or init container) that `c` was parsed from."""
    found = pod.container("initContainers" if c.init else "containers", c.index)
    return found if found is not None else _NO_CONTAINER


def _base(c: ContainerRequest) -> tuple[str | int, ...]:
    return ("spec", "initContainers" if c.init else "containers", c.index)


def _set(path: tuple[str | int, ...], old: Any, new: Any) -> list[Op]:
    return [] if old == new else [{"op": "add", "path": pointer(*path), "value": new}]


def env_ops(pod: PodView, request: PodRequest, allocation: Allocation, backend: str) -> list[Op]:
    """Backend limit variables for every container that asks for GPUs."""
    ops: list[Op] = []
    for c in request.containers:
        if c.gpu is None or c.gpu.count <= 0:
            continue
        container = container_of(pod, c)
        existing = container.raw.get("env")  # the value the `add` replaces
        env: list[Any] = list(container.env)
        present: set[tuple[str, str]] = set()  # literal name=value pairs the container already has
        for e in env:
            if isinstance(e.get("name"), str) and isinstance(e.get("value"), str):
                present.add((e["name"], e["value"]))
        memory, cores = allocation.slice_of(c.name) if allocation.containers else (allocation.memory_mib,
                                                                                  allocation.cores)
        for name, value in limit_env(backend, c.gpu.count, memory, cores):
            if (name, value) not in present:
                env.append({"name": name, "value": value})
        if env or existing is not None:  # no variables for this backend: no empty env list either
            ops += _set((*_base(c), "env"), existing, env)
    return ops


def resource_ops(pod: PodView, request: PodRequest, count_resource: Mapping[str, str]) -> list[Op]:
    """Move memory/compute slices out of `resources` (no node advertises them to the default scheduler;
    a scheduler that reads them keeps them) and make sure the device count is there for the device
    plugin: the count of the same dialect (`nvidia.com/gpu: 1`, `volcano.sh/vgpu-number: 1`) when only
    memory/cores were given."""
    ops: list[Op] = []
    default = request.scheduler_name in ("", "default-scheduler")
    for c in request.containers:
        # A share asked by KAI annotation gets its device count too for the default scheduler: the
        # device plugin then mounts the GPU, and accounting reads the (immutable) count, not the annotation.
        if not c.moved_resources and not (default and c.gpu is not None and not c.gpu.mig):
            continue
        container = container_of(pod, c)
        old = container.raw.get("resources")  # the value the `add` replaces, its other fields kept
        resources: dict[str, Any] = dict(_map(old))
        moved = [n for n in c.moved_resources if not kept_for_scheduler(request.scheduler_name, n)]
        for section in ("limits", "requests") if moved else ():
            if is_mapping(resources.get(section)):
                resources[section] = {k: v for k, v in resources[section].items() if k not in moved}
        if c.gpu is not None and c.gpu.count > 0:
            moved_from = count_name_of(c.moved_resources[0]) if c.moved_resources else None
            count_name = moved_from or count_resource.get(c.gpu.vendor)
            given = [k for s in (container.limits, container.requests) for k in s if _is_count(k)]
            if count_name and not given:
                resources["limits"] = {**_map(resources.get("limits")), count_name: str(c.gpu.count)}
        if old is None and not resources:
            continue
        ops += _set((*_base(c), "resources"), old, resources)
    return ops


def _is_count(name: object) -> bool:
    kind = classify_resource(name) if isinstance(name, str) else None
    return kind is not None and kind[1] in ("count", "device")


def _covers(have: Mapping[str, Any], tol: Mapping[str, Any]) -> bool:
    same_key = have.get("key") == tol.get("key") or (not have.get("key") and have.get("operator") == "Exists")
    same_effect = not have.get("effect") or have.get("effect") == tol.get("effect")
    same_value = have.get("operator") == "Exists" or have.get("value") == tol.get("value")
    return same_key and same_effect and same_value


def toleration_ops(pod: PodView, wanted: list[Mapping[str, Any]]) -> list[Op]:
    """Add each wanted toleration unless one already tolerates the same taint; never duplicate."""
    existing = list(pod.tolerations)
    tolerations: list[Any] = list(existing)
    for tol in wanted:
        for have in tolerations:
            if _covers(have, tol):
                break
        else:
            tolerations.append(dict(tol))
    if not tolerations:
        return []
    return _set(("spec", "tolerations"), existing, tolerations)


def affinity_ops(pod: PodView, required: Mapping[str, Any], preferred: list[str],
                 also: tuple[Mapping[str, Any], ...] = (), prefer: Mapping[str, Any] | None = None) -> list[Op]:
    """AND `required` (a node selector requirement), and those in `also` (a group's domain), into every
    required term the pod already has, and add preferred terms ranking the `preferred` nodes, best first
    (after one preferring the `prefer` requirement: a group's domain, when the group only prefers it)."""
    old = pod.affinity
    affinity: dict[str, Any] = dict(old)
    node_aff = dict(_map(affinity.get("nodeAffinity")))
    terms = _map(node_aff.get(REQUIRED)).get("nodeSelectorTerms")
    terms = [dict(_map(t)) for t in terms] if isinstance(terms, list) and terms else [{}]
    for requirement in (required, *also):
        field = "matchFields" if requirement.get("key") == "metadata.name" else "matchExpressions"
        for term in terms:
            items = list(term.get(field) or [])
            if dict(requirement) not in items:
                items.append(dict(requirement))
            term[field] = items
    node_aff[REQUIRED] = {**_map(node_aff.get(REQUIRED)), "nodeSelectorTerms": terms}
    prefs = list(node_aff.get(PREFERRED) or [])
    present = [_map(p).get("preference") for p in prefs] if prefs else []  # only the pod's own can repeat a name
    if prefer is not None and {"matchExpressions": [dict(prefer)]} not in present:
        prefs.append({"weight": 100, "preference": {"matchExpressions": [dict(prefer)]}})
    for i, name in enumerate(dict.fromkeys(preferred)):
        preference = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
        if not present or preference not in present:
            prefs.append({"weight": max(100 - 10 * i, 1), "preference": preference})
    if prefs:
        node_aff[PREFERRED] = prefs
    affinity["nodeAffinity"] = node_aff
    return _set(("spec", "affinity"), old, affinity)


def record_ops(pod: PodView, allocation: Allocation, value: str | None = None,
               annotations: Mapping[str, str] | None = None) -> list[Op]:
    """The decision annotation (`value`: its sealed text, see record.sealed_text), any other `annotations`
    the decision writes, and the managed label."""
    value = record_value(allocation) if value is None else value
    wanted_by_key = {"annotations": {**(annotations or {}), ANNOTATION: value}, "labels": {MANAGED_LABEL: "true"}}
    ops: list[Op] = []
    for key, wanted in wanted_by_key.items():
        current = pod.annotations if key == "annotations" else pod.labels
        if absent(current):
            ops.append({"op": "add", "path": pointer("metadata", key), "value": dict(wanted)})
            continue
        for name, text in wanted.items():
            if current.get(name) != text:
                ops.append({"op": "add", "path": pointer("metadata", key, name), "value": text})
    return ops
