"""What a pod asks for: vendor resource names, HAMi/KAI/Volcano dialects, pod spec -> PodRequest.

The vendor table is data: a new vendor or dialect is one more row, never a new branch. Parsing never
raises; what is malformed or breaks an isolation rule becomes a Refusal with a message that says
what to change, so the webhook and `check` answer the same thing for the same pod.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from webhook.core.domain.model import ContainerRequest, GpuRequest, PodRequest, TopologyPreference
from webhook.core.domain.names import ALLOCATION, PLACEMENT, PLACEMENT_POLICIES, TOPOLOGY
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.vendor_quota import device_resource

from .dialects import fraction_container, gpu_policy, numa_bind
from .limits import WIDENING_HINTS, is_pin
from .quantity import QuantityError, cpu_milli, memory_mib, parse_quantity
from .vendors import (
    ADVERTISED_BY_NAME,
    GPU_REQUEST_ANNOTATIONS,
    HAMI_NODE_POLICY,
    HAMI_NUMA_BIND,
    HAMI_POLICIES,
    KAI_FRACTION,
    KAI_MEMORY,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS,
    SELECTORS,
    VENDORS,
    VendorResources,
    classify_resource,
    containers_of,
    device_kind,
    foreign_accelerator_message,
    is_bypass_entry,
    is_bypass_env,
    is_device_hostpath,
    is_gpu_pod,
    is_gpu_resource,
    is_limit_env,
    is_mapping,
    kai_request,
    limit_env_of,
    list_of,
    looks_like_gpu,
    mapping_of,
    mig_profile,
    vendor_of_resource,
)

__all__ = [
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


_FIELD_NAMES = {"count": "GPU count", "memory": "memory", "memory_pct": "memory percentage", "cores": "cores",
                "mig": "device count"}
_MOVED_FIELDS = frozenset({"memory", "memory_pct", "cores"})
_SELECTOR_KEYS = frozenset(key for keys in SELECTORS.values() for key in keys)
_TOPOLOGIES = frozenset(t.value for t in TopologyPreference)


MAX_WARNINGS = 10


class _Notes:
    """Violations and warnings collected while parsing one pod."""

    def __init__(self) -> None:
        self.violations: list[Refusal] = []
        self.warnings: list[str] = []
        self._seen: set[tuple[str, str]] = set()  # a set, so that a pod of n containers costs O(n)

    def deny(self, rule: str, code: int, message: str) -> None:
        if ("deny", message) not in self._seen:
            self._seen.add(("deny", message))
            self.violations.append(Refusal(rule, code, message))

    def warn(self, message: str) -> None:
        if ("warn", message) not in self._seen:
            self._seen.add(("warn", message))
            if len(self.warnings) < MAX_WARNINGS:
                self.warnings.append(message)
            elif len(self.warnings) == MAX_WARNINGS:  # a response carries a few, not one per container
                self.warnings.append("more warnings left out: the pod repeats the same problem in many containers")


def _label(container: Mapping[str, Any], init: bool, index: int, kind: str | None = None) -> str:
    name = container.get("name")
    kind = kind or ("init container" if init else "container")
    return f"{kind} {name!r}" if isinstance(name, str) and name else f"{kind} #{index}"


def _gpu_value(field: str, name: str, raw: object, unit: int, where: str, notes: _Notes) -> int | None:
    """A GPU resource value as a whole number within sensible bounds, or None after a violation."""
    if type(raw) is str and len(raw) <= 9 and raw.isascii() and raw.isdigit():
        value = int(raw)  # the usual "1" or "8000": no Fraction needed
    else:
        try:
            quantity = parse_quantity(raw)
        except QuantityError as err:
            notes.deny("invalid-quantity", 422, f"{where}: {name}: {err}; write {_hint(field, unit)}")
            return None
        if quantity.denominator != 1 or quantity.numerator < 0:  # int tests: Fraction comparisons are slow
            notes.deny("invalid-quantity", 422, f"{where}: {name} is {raw}; write {_hint(field, unit)}")
            return None
        value = int(quantity)
    if field in ("memory_pct", "cores") and not (0 if field == "cores" else 1) <= value <= 100:
        rule = "invalid-cores" if field == "cores" else "invalid-quantity"
        bounds = "0..100" if field == "cores" else "1..100"
        notes.deny(rule, 422, f"{where}: {name} is {value}, outside {bounds}; write {_hint(field, unit)}")
        return None
    if field == "memory" and not 1 <= value * unit <= MAX_GPU_MEMORY_MIB:
        notes.deny(
            "invalid-quantity",
            422,
            f"{where}: {name} is {raw}, {value * unit} MiB per GPU, which no GPU has; write {_hint(field, unit)}",
        )
        return None
    if field == "count" and value > MAX_GPUS:
        notes.deny("invalid-quantity", 422, f"{where}: {name} is {value} devices; write a count up to {MAX_GPUS}")
        return None
    return value * unit if field == "memory" else value


def _hint(field: str, unit: int) -> str:
    """What to write instead, for a message about a bad GPU value."""
    if field == "memory":
        return f"a whole number ({unit} MiB units), e.g. 3000" if unit != 1 else "a whole number of MiB, e.g. 3000"
    if field == "cores":
        return "a whole percentage 0..100 (0: no compute cap)"
    return "a whole number of devices, e.g. 1" if field == "count" else "a whole percentage 1..100"


def _host_value(name: str, raw: object, where: str, notes: _Notes) -> int:
    try:
        value = cpu_milli(raw) if name == "cpu" else memory_mib(raw)
    except QuantityError as err:
        notes.deny(
            "invalid-quantity",
            422,
            f"{where}: {name}: {err}; write e.g. {'500m' if name == 'cpu' else '4Gi'}",
        )
        return 0
    if value < 0:
        notes.deny("invalid-quantity", 422, f"{where}: {name} is {raw}; write a value of at least 0")
        return 0
    return value


def _parse_container(
    container: Mapping[str, Any], index: int, init: bool, exempt_env: bool, notes: _Notes,
    label_kind: str | None = None,
) -> tuple[ContainerRequest, list[Refusal], bool]:
    """One container; returns it, the isolation findings that apply only to GPU pods, and whether the
    container alone makes a GPU pod (a GPU resource named, or a device variable set: see is_gpu_pod)."""
    where = _label(container, init, index, label_kind)
    resources = mapping_of(container.get("resources"))
    limits, requests = mapping_of(resources.get("limits")), mapping_of(resources.get("requests"))
    merged: dict[str, object] = {**requests, **limits}  # GPU resources: limits win
    values: dict[str, tuple[str, int]] = {}
    vendor: str | None = None
    moved: list[str] = []
    gpu_signal = False
    for name, raw in merged.items():
        kind = classify_resource(name) if isinstance(name, str) else None
        if kind is None:
            if isinstance(name, str) and name not in ("cpu", "memory") and looks_like_gpu(name):
                notes.warn(foreign_accelerator_message(where, name))
            continue
        gpu_signal = True
        kind_vendor, field, unit = kind
        if field in _MOVED_FIELDS and name not in moved:
            moved.append(name)
        if vendor is not None and kind_vendor != vendor:
            notes.deny(
                "mixed-vendors",
                422,
                f"{where} asks for {vendor} and {kind_vendor} devices; use one vendor per pod",
            )
            continue
        vendor = kind_vendor
        if field == "device" and kind_vendor in ADVERTISED_BY_NAME:
            field = "mig"  # devices of a resource the plugin advertises by name: placed as MIG devices are
        elif field == "device":
            notes.warn(f"{where}: {name} is not in the vendor table; counted as whole {kind_vendor} devices")
            field = "count"
        value = _gpu_value("count" if field == "mig" else field, name, raw, unit, where, notes)
        if field in values:
            notes.deny(
                "duplicate-resource",
                422,
                f"{where} gives the {_FIELD_NAMES[field]} twice ({values[field][0]} and {name}); keep one",
            )
            continue
        if value is not None:
            values[field] = (name, value)
    if "memory" in values and "memory_pct" in values:
        # HAMi's Fit takes the absolute figure when both are given; so do we, saying so.
        notes.warn(f"{where} sets {values['memory'][0]} and {values['memory_pct'][0]}; "
                   f"{values['memory'][0]} applies")
        del values["memory_pct"]
    gpu: GpuRequest | None = None
    if "mig" in values:  # whole devices of one MIG profile or advertised resource, nothing else here
        if len(values) > 1:
            name = values["mig"][0]
            others = ", ".join(v[0] for f, v in values.items() if f != "mig")
            why = ("a MIG device is bounded by its profile: ask for the MIG devices alone" if mig_profile(name)
                   else f"its device plugin hands out {name} as it is: ask for it alone")
            notes.deny("mig-mixed", 422, f"{where} asks for {name} together with {others}; {why}")
        elif values["mig"][1] > 0:
            name = values["mig"][0]
            gpu = GpuRequest(vendor or "nvidia", values["mig"][1], mig=device_kind(name))
    elif vendor is not None:
        count = values["count"][1] if "count" in values else (1 if values else 0)
        if count == 0 and len(values) > 1:
            notes.deny(
                "invalid-quantity",
                422,
                f"{where} sets {values['count'][0]} to 0 together with GPU memory "
                "or cores; ask for at least 1 GPU or remove them",
            )
        if count > 0:
            gpu = GpuRequest(vendor, count, _get(values, "memory"), _get(values, "memory_pct"), _get(values, "cores"))
    host_cpu, host_mem = 0, 0
    for name in ("cpu", "memory"):
        raw = requests.get(name, limits.get(name))
        if raw is not None:
            value = _host_value(name, raw, where, notes)
            host_cpu, host_mem = (value, host_mem) if name == "cpu" else (host_cpu, value)
    findings: list[Refusal] = []
    exempt: dict[str, str] | None = None  # limit_env_of(container), made when an entry needs it
    for entry in list_of(container.get("env")):
        fields = mapping_of(entry)
        env_name = fields.get("name")
        if not isinstance(env_name, str):
            continue
        if exempt_env and gpu_signal and isinstance(fields.get("value"), str) and is_limit_env(env_name):
            continue  # a limit the record dictates (exempt by itself), in a container already a GPU one
        bypass = is_bypass_entry(entry)
        gpu_signal = gpu_signal or bypass
        if not bypass and env_name != "LD_PRELOAD":
            continue
        if exempt is None:
            exempt = limit_env_of(container) if exempt_env else {}
        if env_name in exempt:
            continue
        if bypass:
            notes.deny(
                "isolation-env",
                403,
                f"{where} sets {env_name} itself, which bypasses GPU isolation; remove it and "
                + WIDENING_HINTS.get(env_name, "ask for GPUs in resources.limits (e.g. nvidia.com/gpu: 1)"),
            )
        elif env_name == "LD_PRELOAD" and not is_pin(env_name, mapping_of(entry)):  # "" pins it off
            findings.append(
                Refusal(
                    "isolation-env",
                    403,
                    f"{where} sets LD_PRELOAD, which can unload the GPU limit library; remove it from a GPU pod",
                )
            )
    if mapping_of(container.get("securityContext")).get("privileged") is True:
        findings.append(
            Refusal(
                "isolation-privileged",
                403,
                f"{where} is privileged, which exposes every GPU of the node; set securityContext.privileged: false",
            )
        )
    given = container.get("name")
    request = ContainerRequest(
        given if isinstance(given, str) else "", index, init, gpu, host_cpu, host_mem, tuple(moved)
    )
    return request, findings, gpu_signal


def _get(values: Mapping[str, tuple[str, int]], field: str) -> int | None:
    return values[field][1] if field in values else None


def _kai_container(containers: list[ContainerRequest], annotations: Mapping[str, Any], notes: _Notes) -> int | None:
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
    annotations: Mapping[str, Any], key: str, allowed: Collection[str], notes: _Notes, strict: bool = True
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


def _pod_level(containers: list[ContainerRequest], spec: Mapping[str, Any], notes: _Notes) -> dict[str, Any]:
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
        restartable = {
            i
            for i, c in enumerate(list_of(spec.get("initContainers")))
            if mapping_of(c).get("restartPolicy") == "Always"
        }
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
    overhead = mapping_of(spec.get("overhead"))
    if overhead:
        if "cpu" in overhead:
            cpu += _host_value("cpu", overhead["cpu"], "overhead", notes)
        if "memory" in overhead:
            memory += _host_value("memory", overhead["memory"], "overhead", notes)
    return {
        "gpus": gpus,
        "memory_mib": memory_mib,
        "memory_pct": memory_pct,
        "cores": cores,
        "cpu_milli": cpu,
        "memory_mib_host": memory,
    }


def _mig_of(containers: list[ContainerRequest], notes: _Notes) -> str:
    """The one MIG profile the pod's GPU containers ask for ("" when they ask for cards). One profile per
    pod: placement reads one device kind per pod, as it reads one vendor."""
    kinds = {c.gpu.mig for c in containers if c.gpu is not None}
    if len(kinds) > 1:
        shown = " and ".join(device_resource(k) if k else "whole GPUs" for k in sorted(kinds))
        one = "one MIG profile" if all("/" not in k for k in kinds) else "one device resource"
        notes.deny("mig-mixed", 422, f"the pod asks for {shown}; ask for {one} per pod, or for whole GPUs")
    return next(iter(kinds)) if len(kinds) == 1 else ""


# Requests are made by evolve() from this one: a frozen dataclass's __init__ costs a call per field.
_BLANK_REQUEST = PodRequest(namespace="", name="")
_FIELD_COUNT = len(_BLANK_REQUEST.__dict__)


def parse_pod(pod: Mapping[str, Any], namespace: str | None = None) -> PodRequest:
    """A pod (or pod template with metadata) -> PodRequest. Never raises; problems become violations."""
    notes = _Notes()
    if not is_mapping(pod):
        notes.deny("invalid-pod", 422, "the object is not a pod: expected a mapping")
        pod = {}
    metadata, spec = mapping_of(pod.get("metadata")), mapping_of(pod.get("spec"))
    annotations = mapping_of(metadata.get("annotations"))
    exempt_env = ALLOCATION in annotations
    containers: list[ContainerRequest] = []
    findings: list[Refusal] = []
    if not isinstance(spec.get("containers"), list) or not spec["containers"]:
        notes.deny("invalid-pod", 422, "spec.containers: a pod needs at least one container")
    # Whether this is a GPU pod (is_gpu_pod's definition), collected while parsing instead of read twice.
    gpu_pod = bool(annotations) and not GPU_REQUEST_ANNOTATIONS.isdisjoint(annotations)
    for init, index, container in containers_of(spec):
        request, found, gpu_signal = _parse_container(container, index, init, exempt_env, notes)
        containers.append(request)
        findings.extend(found)
        gpu_pod = gpu_pod or gpu_signal
    # Ephemeral containers (`kubectl debug`) are held to the same isolation rules; they take no part in
    # the pod's resources (the API refuses resources on them), so they are not among `containers`.
    for index, container in enumerate(list_of(spec.get("ephemeralContainers"))):
        request, found, gpu_signal = _parse_container(
            mapping_of(container), index, False, False, notes, "ephemeral container"
        )
        findings.extend(found)
        gpu_pod = gpu_pod or gpu_signal
        if request.gpu is not None:
            notes.deny("ephemeral-resources", 422,
                       f"ephemeral container {request.name!r} asks for GPUs; ephemeral containers cannot have "
                       "resources: debug with a container that asks for none")
    annotation_gpu, annotation_error = kai_request(annotations)
    if annotation_error:
        notes.deny("invalid-annotation", 422, annotation_error)
    if annotation_gpu is not None:
        owner = _kai_container(containers, annotations, notes) if containers else None
        # Conflict unless the only GPU resource is the plain device count the mutation adds for the
        # default scheduler to the container the share belongs to (what accounting reads).
        if any(c.gpu for c in containers) and not _counted_kai_owner(
            containers, owner, annotation_gpu, spec.get("schedulerName")
        ):
            notes.deny(
                "dialect-conflict",
                422,
                f"the pod asks for GPUs in resources and in the {KAI_FRACTION}/"
                f"{KAI_MEMORY} annotations; use one of them",
            )
        elif owner is not None:
            c = containers[owner]
            containers[owner] = ContainerRequest(
                c.name, c.index, c.init, annotation_gpu, c.cpu_milli, c.memory_mib, c.moved_resources
            )
    vendors: set[str] = set()
    for c in containers:
        if c.gpu is not None:
            vendors.add(c.gpu.vendor)
    if len(vendors) > 1:
        shown = " and ".join(sorted(vendors))
        notes.deny("mixed-vendors", 422, f"the pod asks for {shown} devices; use one vendor per pod")
    mig = _mig_of(containers, notes)
    host_paths: list[str] = []
    for volume in list_of(spec.get("volumes")):
        path = mapping_of(mapping_of(volume).get("hostPath")).get("path")
        if is_device_hostpath(path):
            host_paths.append(str(path))
    gpu_pod = gpu_pod or bool(host_paths)
    if gpu_pod:
        for finding in findings:
            notes.deny(finding.rule, finding.code, finding.message)
        for path in host_paths:
            notes.deny(
                "isolation-hostpath",
                403,
                f"volume hostPath {path} exposes the node's GPU devices; "
                "remove it and ask for GPUs in resources.limits",
            )
    include, exclude, uuids_in, uuids_out = _selectors(annotations, next(iter(vendors)) if len(vendors) == 1 else "")
    placement = _choice(annotations, PLACEMENT, PLACEMENT_POLICIES, notes)
    if placement is None:
        placement = _choice(annotations, HAMI_NODE_POLICY, HAMI_POLICIES, notes, strict=False)
    topology_name = _choice(annotations, TOPOLOGY, _TOPOLOGIES, notes)
    hami = gpu_policy(annotations)
    for warning in hami.warnings:
        notes.warn(warning)
    level = _pod_level(containers, spec, notes)
    if level["gpus"] > 1 and numa_bind(annotations):
        notes.warn(f"annotation {HAMI_NUMA_BIND}: GPUs are chosen by link topology, which prefers one NUMA node")
    name = metadata.get("name") or metadata.get("generateName") or ""
    scheduler = spec.get("schedulerName")
    node_name = spec.get("nodeName")
    # Made as PodRequest.evolve makes a request, with the fields stored straight into the copy of the
    # blank one's: passing two dozen of them as keywords costs a fifth of parsing the pod.
    fields = _BLANK_REQUEST.__dict__.copy()
    fields["namespace"] = namespace or str(metadata.get("namespace") or "default")
    fields["name"] = str(name)
    fields["containers"] = tuple(containers)
    fields["uid"] = str(metadata.get("uid") or "")
    fields["vendor"] = next(iter(vendors)) if len(vendors) == 1 else ""
    fields["models_include"], fields["models_exclude"] = include, exclude
    fields["uuids_include"], fields["uuids_exclude"] = uuids_in, uuids_out
    fields["placement"] = placement
    fields["gpu_placement"] = hami.placement
    fields["topology"] = TopologyPreference(topology_name) if topology_name else hami.topology
    fields["scheduler_name"] = scheduler if isinstance(scheduler, str) and scheduler else "default-scheduler"
    fields["node_name"] = node_name if isinstance(node_name, str) else ""
    fields["is_gpu_pod"] = gpu_pod
    fields["mig"] = mig
    fields["violations"] = tuple(notes.violations)
    fields["warnings"] = tuple(notes.warnings)
    fields["raw"] = pod
    fields.update(level)
    if len(fields) != _FIELD_COUNT:  # a name PodRequest lacks was stored: a mistake here, not in the pod
        raise TypeError(f"PodRequest has no field {', '.join(sorted(fields.keys() - _BLANK_REQUEST.__dict__.keys()))}")
    parsed: PodRequest = object.__new__(PodRequest)
    object.__setattr__(parsed, "__dict__", fields)
    return parsed
