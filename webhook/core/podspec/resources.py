"""A pod's fields read into a `PodRequest`: its containers (`container.py`), the pod-level demand as
Kubernetes counts it, KAI's share annotations (`kai.py`), HAMi's selection and policy annotations
(`dialects.py`), and the isolation findings that apply to a GPU pod.

Parsing never raises; what is malformed or breaks an isolation rule becomes a Refusal with a message that
says what to change, so the webhook and `check` answer the same thing for the same pod.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from webhook.core.domain.names import ALLOCATION, PLACEMENT, PLACEMENT_POLICIES, TOPOLOGY
from webhook.core.domain.podview import PodView
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.request import ContainerRequest, GpuRequest, PodRequest, TopologyPreference
from webhook.core.domain.vendor_quota import device_resource

from . import view as views
from .coerce import is_mapping, mapping_of
from .container import MAX_WARNINGS, Notes, host_value, parse_container
from .dialects import HAMI_GPU_POLICY, HAMI_NODE_POLICY, HAMI_NUMA_BIND, HAMI_POLICIES, gpu_policy, numa_bind
from .envvars import is_bypass_env, is_limit_env, limit_env_of
from .fastpath import GPU_REQUEST_ANNOTATIONS, is_gpu_pod
from .hostpaths import is_device_hostpath
from .kai import KAI_FRACTION, KAI_MEMORY, fraction_container, kai_request
from .quantity import parse_quantity
from .vendor_table import SELECTORS, VENDORS, VendorResources, classify_resource, is_gpu_resource, vendor_of_resource

__all__ = [
    "MAX_WARNINGS",
    "VENDORS",
    "VendorResources",
    "classify_resource",
    "vendor_of_resource",
    "is_gpu_resource",
    "parse_pod",
    "is_gpu_pod",
    "limit_env_of",
    "is_limit_env",
    "is_bypass_env",
    "parse_quantity",
]

_SELECTOR_KEYS = frozenset(key for keys in SELECTORS.values() for key in keys)
_TOPOLOGIES = frozenset(t.value for t in TopologyPreference)


def _kai_container(containers: list[ContainerRequest], annotations: Mapping[str, Any], notes: Notes) -> int | None:
    """The container KAI gives the share to (see `fraction_container`); None, with the refusal noted, when
    the annotation names no container or the share would reach an Argo pod's executor."""
    target = fraction_container([(c.name, c.init) for c in containers], annotations)
    if target.problem:
        notes.deny("invalid-annotation", 422, target.problem)
    return target.position


def _counted_kai_owner(containers: list[ContainerRequest], owner: int | None, share: GpuRequest,
                       scheduler: object) -> bool:
    """True when the only GPU resource of a default-scheduler pod asking by KAI annotation is the plain
    device count of the annotation, on the container the share belongs to (what the mutation writes)."""
    if owner is None or scheduler not in (None, "", "default-scheduler"):
        return False
    have = containers[owner].gpu
    others = any(c.gpu for i, c in enumerate(containers) if i != owner)
    return (not others and have is not None and not containers[owner].moved_resources and not have.mig
            and (have.vendor, have.count, have.memory_mib, have.memory_pct, have.cores)
            == (share.vendor, share.count, None, None, None))


def _effective(app: list[int], init: list[tuple[int, bool]]) -> int:
    """Kubernetes' effective request: max(sum of app containers and sidecars, each init container plus
    the sidecars started before it). `init` is (value, restartable sidecar) in order."""
    sidecars, peak = 0, 0
    for value, restartable in init:
        if restartable:
            sidecars += value
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + value)
    return max(sum(app) + sidecars, peak)


def _csv(annotations: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = annotations.get(key)
    if not isinstance(value, str):
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _selectors(annotations: Mapping[str, Any], vendor: str) -> tuple[tuple[str, ...], ...]:
    """HAMi's GPU selection annotations, (use-type, nouse-type, use-uuid, nouse-uuid): the pod's vendor's
    own (HAMi's Hygon devices read only hygon.com/use-dcutype, never nvidia.com/use-gputype), every
    vendor's while the pod names none."""
    if _SELECTOR_KEYS.isdisjoint(annotations):  # the usual pod: twelve look-ups saved
        return (), (), (), ()
    rows = [SELECTORS[vendor]] if vendor in SELECTORS else list(SELECTORS.values())
    return tuple(tuple(x for v in rows for x in _csv(annotations, v[i])) for i in range(4))


def _choice(
    annotations: Mapping[str, Any], key: str, allowed: Collection[str], notes: Notes, strict: bool = True
) -> str | None:
    """An enumerated annotation. Ours (strict) deny bad values; other dialects' are ignored with a warning."""
    value = annotations.get(key)
    if value is None:
        return None
    text = value.strip().lower() if isinstance(value, str) else ""
    if text not in allowed:
        choices = ", ".join(sorted(allowed))
        if strict:
            notes.deny("invalid-annotation", 422, f"annotation {key} is {value!r}; use one of {choices}")
        else:
            notes.warn(f"annotation {key} is {value!r}, not one of {choices}; ignored")
        return None
    return text


def _pod_level(containers: list[ContainerRequest], view: PodView, notes: Notes) -> dict[str, Any]:
    """GPUs, per-GPU demand and host resources of the pod; init containers counted as Kubernetes does.
    One pass over the containers for the usual pod; the init-container arithmetic only when there are some."""
    gpus = cpu = memory = 0
    has_init = False
    gpu_requests: list[GpuRequest] = []
    for c in containers:
        if c.init:
            has_init = True
        elif c.gpu is not None:
            gpus += c.gpu.count
        if c.gpu is not None:
            gpu_requests.append(c.gpu)
        cpu += c.cpu_milli
        memory += c.memory_mib
    if has_init:
        restartable = {c.index for c in view.containers if c.kind == "initContainers" and c.restart_policy == "Always"}
        app = [c for c in containers if not c.init]
        init = [c for c in containers if c.init]

        def effective(get: Any) -> int:
            return _effective([get(c) for c in app], [(get(c), c.index in restartable) for c in init])

        gpus = effective(lambda c: c.gpu.count if c.gpu else 0)
        cpu = effective(lambda c: c.cpu_milli)
        memory = effective(lambda c: c.memory_mib)
    # Per-GPU slices: the largest asked by any container; none when one container wants whole cards.
    memory_mib = memory_pct = cores = None
    for g in gpu_requests:
        if g.memory_mib is None and g.memory_pct is None and g.cores is None:
            memory_mib = memory_pct = cores = None
            break
        if g.memory_mib is not None and (memory_mib is None or g.memory_mib > memory_mib):
            memory_mib = g.memory_mib
        if g.memory_pct is not None and (memory_pct is None or g.memory_pct > memory_pct):
            memory_pct = g.memory_pct
        if g.cores is not None and (cores is None or g.cores > cores):
            cores = g.cores
    overhead = view.overhead
    if overhead:
        if "cpu" in overhead:
            cpu += host_value("cpu", overhead["cpu"], "overhead", notes)
        if "memory" in overhead:
            memory += host_value("memory", overhead["memory"], "overhead", notes)
    return {
        "gpus": gpus,
        "memory_mib": memory_mib,
        "memory_pct": memory_pct,
        "cores": cores,
        "cpu_milli": cpu,
        "memory_mib_host": memory,
    }


def _mig_of(containers: list[ContainerRequest], notes: Notes) -> str:
    """The one MIG profile the pod's GPU containers ask for ("" when they ask for cards). One profile per
    pod: placement reads one device kind per pod, as it reads one vendor."""
    kinds = {c.gpu.mig for c in containers if c.gpu is not None}
    if len(kinds) > 1:
        shown = " and ".join(device_resource(k) if k else "whole GPUs" for k in sorted(kinds))
        one = "one MIG profile" if all("/" not in k for k in kinds) else "one device resource"
        notes.deny("mig-mixed", 422, f"the pod asks for {shown}; ask for {one} per pod, or for whole GPUs")
    return next(iter(kinds)) if len(kinds) == 1 else ""


def _containers(view: PodView, notes: Notes) -> tuple[list[ContainerRequest], list[Refusal], bool]:
    """The pod's containers (app, then init), the isolation findings that apply to a GPU pod, and whether
    a container or an annotation makes it one (is_gpu_pod's definition, collected while parsing)."""
    annotations = view.annotations
    exempt_env = ALLOCATION in annotations
    containers: list[ContainerRequest] = []
    findings: list[Refusal] = []
    if not view.containers or view.containers[0].kind != "containers":  # app containers come first
        notes.deny("invalid-pod", 422, "spec.containers: a pod needs at least one container")
    gpu_pod = bool(annotations) and not GPU_REQUEST_ANNOTATIONS.isdisjoint(annotations)
    # Ephemeral containers (`kubectl debug`) are held to the same isolation rules; they take no part in
    # the pod's resources (the API refuses resources on them), so they are not among `containers`.
    for view_of_container in view.containers:
        kind = view_of_container.kind
        ephemeral = kind == "ephemeralContainers"
        request, found, gpu_signal = parse_container(
            view_of_container, exempt_env and not ephemeral, notes, "ephemeral container" if ephemeral else None)
        findings.extend(found)
        gpu_pod = gpu_pod or gpu_signal
        if not ephemeral:
            containers.append(request)
        elif request.gpu is not None:
            notes.deny("ephemeral-resources", 422,
                       f"ephemeral container {request.name!r} asks for GPUs; ephemeral containers cannot have "
                       "resources: debug with a container that asks for none")
    return containers, findings, gpu_pod


def _kai_share(containers: list[ContainerRequest], annotations: Mapping[str, Any], scheduler: object,
               notes: Notes) -> None:
    """KAI's share annotations given to the container they belong to (in place), or the refusal noted."""
    annotation_gpu, annotation_error = kai_request(annotations)
    if annotation_error:
        notes.deny("invalid-annotation", 422, annotation_error)
    if annotation_gpu is None:
        return
    owner = _kai_container(containers, annotations, notes) if containers else None
    # Conflict unless the only GPU resource is the plain device count the mutation adds for the
    # default scheduler to the container the share belongs to (what accounting reads).
    if any(c.gpu for c in containers) and not _counted_kai_owner(containers, owner, annotation_gpu, scheduler):
        notes.deny("dialect-conflict", 422,
                   f"the pod asks for GPUs in resources and in the {KAI_FRACTION}/{KAI_MEMORY} annotations; "
                   "use one of them")
    elif owner is not None:
        c = containers[owner]
        containers[owner] = ContainerRequest(
            c.name, c.index, c.init, annotation_gpu, c.cpu_milli, c.memory_mib, c.moved_resources
        )


def _isolation(view: PodView, findings: list[Refusal], gpu_pod: bool, notes: Notes) -> bool:
    """Device hostPath volumes make a GPU pod; a GPU pod's findings and such volumes are denied."""
    host_paths: list[str] = []
    for volume in view.volumes:
        host_path = volume.get("hostPath")
        if not host_path:  # most volumes: a Secret, a ConfigMap, an emptyDir
            continue
        path = mapping_of(host_path).get("path")
        if is_device_hostpath(path):
            host_paths.append(str(path))
    gpu_pod = gpu_pod or bool(host_paths)
    if gpu_pod:
        for finding in findings:
            notes.deny(finding.rule, finding.code, finding.message)
        for path in host_paths:
            notes.deny("isolation-hostpath", 403,
                       f"volume hostPath {path} exposes the node's GPU devices; "
                       "remove it and ask for GPUs in resources.limits")
    return gpu_pod


def _scheduling(annotations: Mapping[str, Any], vendor: str, notes: Notes) -> dict[str, Any]:
    """The PodRequest fields read from scheduling annotations: ours, then HAMi's."""
    if _SCHEDULING_KEYS.isdisjoint(annotations):  # the usual pod: the fields of no annotation, made once
        return _NO_SCHEDULING
    return _read_scheduling(annotations, vendor, notes)


def _read_scheduling(annotations: Mapping[str, Any], vendor: str, notes: Notes) -> dict[str, Any]:
    include, exclude, uuids_in, uuids_out = _selectors(annotations, vendor)
    placement = _choice(annotations, PLACEMENT, PLACEMENT_POLICIES, notes)
    if placement is None:
        placement = _choice(annotations, HAMI_NODE_POLICY, HAMI_POLICIES, notes, strict=False)
    topology_name = _choice(annotations, TOPOLOGY, _TOPOLOGIES, notes)
    hami = gpu_policy(annotations)
    for warning in hami.warnings:
        notes.warn(warning)
    return {
        "models_include": include, "models_exclude": exclude, "uuids_include": uuids_in,
        "uuids_exclude": uuids_out, "placement": placement, "gpu_placement": hami.placement,
        "topology": TopologyPreference(topology_name) if topology_name else hami.topology,
    }


_SCHEDULING_KEYS = frozenset({*_SELECTOR_KEYS, PLACEMENT, HAMI_NODE_POLICY, TOPOLOGY, HAMI_GPU_POLICY})
_NO_SCHEDULING = _read_scheduling({}, "", Notes())  # read only (the caller copies it)


# Requests are made from a copy of this one's fields (see parse_pod): a frozen dataclass's __init__
# costs a call per field.
_BLANK_REQUEST = PodRequest(namespace="", name="")
_FIELD_COUNT = len(_BLANK_REQUEST.__dict__)


def parse_pod(pod: Mapping[str, Any] | PodView, namespace: str | None = None) -> PodRequest:
    """A pod (or pod template with metadata), or its view -> PodRequest. Never raises; problems become
    violations."""
    notes = Notes()
    if isinstance(pod, PodView):
        view = pod
    else:
        if not is_mapping(pod):
            notes.deny("invalid-pod", 422, "the object is not a pod: expected a mapping")
            pod = {}
        view = views.view_of(pod)
    annotations = view.annotations
    containers, findings, gpu_pod = _containers(view, notes)
    _kai_share(containers, annotations, view.scheduler_name, notes)
    vendors = {c.gpu.vendor for c in containers if c.gpu is not None}
    if len(vendors) > 1:
        shown = " and ".join(sorted(vendors))
        notes.deny("mixed-vendors", 422, f"the pod asks for {shown} devices; use one vendor per pod")
    vendor = next(iter(vendors)) if len(vendors) == 1 else ""
    mig = _mig_of(containers, notes)
    gpu_pod = _isolation(view, findings, gpu_pod, notes)
    scheduling = _scheduling(annotations, vendor, notes)
    level = _pod_level(containers, view, notes)
    if level["gpus"] > 1 and numa_bind(annotations):
        notes.warn(f"annotation {HAMI_NUMA_BIND}: GPUs are chosen by link topology, which prefers one NUMA node")
    # Made as PodRequest.evolve makes a request, with the fields stored straight into the copy of the
    # blank one's. Kept because it pays: 1.1 us a request against 4.4 us for PodRequest(**fields) and
    # 5.5 us for evolve(**fields), of about 18 us for parsing one of benchmarks/admission_load.py's pods.
    fields = _BLANK_REQUEST.__dict__.copy()
    fields["namespace"] = namespace or view.namespace or "default"
    fields["name"] = view.name
    fields["containers"] = tuple(containers)
    fields["uid"] = view.uid
    fields["vendor"] = vendor
    fields["scheduler_name"] = view.scheduler_name or "default-scheduler"
    fields["node_name"] = view.node_name
    fields["is_gpu_pod"] = gpu_pod
    fields["mig"] = mig
    fields["violations"] = tuple(notes.violations)
    fields["warnings"] = tuple(notes.warnings)
    fields["raw"] = view.raw
    fields["view"] = view
    fields.update(scheduling)
    fields.update(level)
    if len(fields) != _FIELD_COUNT:  # a name PodRequest lacks was stored: a mistake here, not in the pod
        raise TypeError(f"PodRequest has no field {', '.join(sorted(fields.keys() - _BLANK_REQUEST.__dict__.keys()))}")
    parsed: PodRequest = object.__new__(PodRequest)
    object.__setattr__(parsed, "__dict__", fields)
    return parsed
