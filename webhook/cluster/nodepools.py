"""Node pools the cluster states that can scale from zero, read as the core's `ScalePool`: Karpenter
NodePools and cluster-autoscaler's Cluster API node groups (core/placement/capacity.py judges them).

Pure functions of the raw objects, each giving the pool or why the object is no pool (the watch cache and
`build_snapshot` skip it), and of the nodes a NodePool made (its limits count them).

- **Karpenter NodePool** (`karpenter.sh/v1`, kubernetes-sigs/karpenter `pkg/apis/v1/nodepool.go`): the
  labels of `spec.template.metadata.labels`, `karpenter.sh/nodepool: <name>` (Karpenter adds it to every
  node it makes) and each single-valued `In` requirement; every requirement of
  `spec.template.spec.requirements`, matched as Karpenter matches them (the core); the taints of
  `spec.template.spec.taints` (`startupTaints` are removed once the node is ready: no pod tolerates them);
  `spec.limits` with what its nodes (labelled `karpenter.sh/nodepool=<name>`) hold, by their allocatable.
  A NodePool whose Ready condition is False makes no node. Its weight orders it among the others.
- **Cluster API node group** (`cluster.x-k8s.io/v1beta1` MachineDeployment, MachineSet, MachinePool;
  kubernetes/autoscaler `cluster-autoscaler/cloudprovider/clusterapi/README.md` and
  `clusterapi_unstructured.go`): a group carries both `cluster.x-k8s.io/cluster-api-autoscaler-node-group-
  min-size` and `-max-size`; its GPUs are the `capacity.cluster-autoscaler.kubernetes.io/gpu-count` of the
  resource `gpu-type` (the autoscaler makes no GPU node without both), its labels the managed ones of its
  template and the `labels` annotation (`k=v,...`, which wins), its taints the template's and the `taints`
  annotation's (`key=value:Effect,...`, which wins on the same key and effect), its node's CPU and memory
  the `cpu` and `memory` annotations. The GPU model and memory per card come from the labels GFD would put
  on the node (`nvidia.com/gpu.product`, `nvidia.com/gpu.memory`) when the labels annotation states them.
  A group at its max size (`spec.replicas` >= max) makes no node; a paused one is not scaled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.domain.model import Node, ScalePool, Taint
from webhook.core.placement.capacity import NODEPOOL
from webhook.core.podspec.coerce import mapping_of
from webhook.core.podspec.quantity import QuantityError, cpu_milli, memory_mib, parse_quantity
from webhook.core.podspec.vendor_table import COUNT_RESOURCES

# our name for the watched kind -> (API group, version, plural, Kind); all optional APIs
POOL_KINDS: Mapping[str, tuple[str, str, str, str]] = {
    "nodepools": ("karpenter.sh", "v1", "nodepools", NODEPOOL),
    "machinedeployments": ("cluster.x-k8s.io", "v1beta1", "machinedeployments", "MachineDeployment"),
    "machinesets": ("cluster.x-k8s.io", "v1beta1", "machinesets", "MachineSet"),
    "machinepools": ("cluster.x-k8s.io", "v1beta1", "machinepools", "MachinePool"),
}
POOL_KIND_NAMES = frozenset(spec[3] for spec in POOL_KINDS.values())
NODEPOOL_LABEL = "karpenter.sh/nodepool"
_CAPI = "cluster.x-k8s.io/"
MIN_SIZE = _CAPI + "cluster-api-autoscaler-node-group-min-size"
MAX_SIZE = _CAPI + "cluster-api-autoscaler-node-group-max-size"
PAUSED = _CAPI + "paused"
_CAPACITY = "capacity.cluster-autoscaler.kubernetes.io/"
GPU_COUNT, GPU_TYPE, DRA_DRIVER = _CAPACITY + "gpu-count", _CAPACITY + "gpu-type", _CAPACITY + "dra-driver"
LABELS, TAINTS, CPU, MEMORY = _CAPACITY + "labels", _CAPACITY + "taints", _CAPACITY + "cpu", _CAPACITY + "memory"
# Label domains Cluster API puts on a node from its Machine (the autoscaler's isManagedLabel)
_MANAGED = ("node-role.kubernetes.io", "node-restriction.kubernetes.io", "node.cluster.x-k8s.io")
_VENDOR_OF = {resource: vendor for vendor, resource in COUNT_RESOURCES.items()}


def _strings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in mapping_of(value).items() if isinstance(v, (str, int, float, bool))}


def _taint(item: object) -> Taint | None:
    raw = mapping_of(item)
    key = raw.get("key")
    if not isinstance(key, str) or not key:
        return None
    return Taint(key, str(raw.get("value") or ""), str(raw.get("effect") or "NoSchedule"))


def read_pool(obj: Mapping[str, Any]) -> ScalePool | str:
    """The pool an object states, or why it states none."""
    if obj.get("kind") == NODEPOOL:
        return nodepool_of(obj)
    return node_group_of(obj)


# -- Karpenter ------------------------------------------------------------------------------------------


def nodepool_of(obj: Mapping[str, Any]) -> ScalePool | str:
    """A Karpenter NodePool as a pool (its GPUs come from its requirements, judged per pod)."""
    name = mapping_of(obj.get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        return "metadata.name: required"
    spec = mapping_of(obj.get("spec"))
    template = mapping_of(spec.get("template"))
    labels = _strings(mapping_of(template.get("metadata")).get("labels"))
    requirements = []
    for i, item in enumerate(mapping_of(template.get("spec")).get("requirements") or ()):
        raw = mapping_of(item)
        key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
        if not isinstance(key, str) or not isinstance(operator, str) or not isinstance(values, list):
            return f"spec.template.spec.requirements[{i}]: expected key, operator and values"
        requirements.append((key, operator, tuple(str(v) for v in values)))
        if operator == "In" and len(values) == 1:
            labels.setdefault(key, str(values[0]))
    labels[NODEPOOL_LABEL] = name
    taints = tuple(t for t in map(_taint, mapping_of(template.get("spec")).get("taints") or ()) if t is not None)
    limits: dict[str, int] = {}
    for resource, quantity in mapping_of(spec.get("limits")).items():
        try:
            limits[str(resource)] = _amount(str(resource), quantity)
        except QuantityError as err:
            return f"spec.limits[{resource}]: {err}"
    ready = [c for c in mapping_of(obj.get("status")).get("conditions") or () if mapping_of(c).get("type") == "Ready"]
    full = ""
    if ready and mapping_of(ready[0]).get("status") == "False":
        full = f"the NodePool is not Ready ({mapping_of(ready[0]).get('reason') or 'no reason given'})"
    return ScalePool(name, labels, taints, gpu_count=0, kind=NODEPOOL, requirements=tuple(requirements),
                     limits=limits, full=full)


def _amount(resource: str, quantity: object) -> int:
    """A limit in the unit ScalePool counts it: CPU millicores, memory MiB, anything else whole units."""
    if resource == "cpu":
        return cpu_milli(quantity)
    if resource == "memory":
        return memory_mib(quantity)
    return int(parse_quantity(quantity))


def weight_of(obj: Mapping[str, Any]) -> int:
    weight = mapping_of(obj.get("spec")).get("weight")
    return weight if type(weight) is int else 0


def with_usage(pool: ScalePool, nodes: Iterable[Node]) -> ScalePool:
    """A NodePool with what its nodes already hold of each resource its limits name (their allocatable)."""
    if not pool.limits:
        return pool
    used = dict.fromkeys(pool.limits, 0)
    for node in nodes:
        if node.labels.get(NODEPOOL_LABEL) != pool.name:
            continue
        for resource in used:
            if resource == "cpu":
                used[resource] += node.cpu_milli
            elif resource == "memory":
                used[resource] += node.memory_mib
            elif _VENDOR_OF.get(resource) == node.vendor and node.gpus:
                units = node.gpu_units if resource == "nvidia.com/gpu" else None
                used[resource] += units if units is not None else len(node.gpus)
    return replace(pool, used=used)


# -- Cluster API ----------------------------------------------------------------------------------------


def node_group_of(obj: Mapping[str, Any]) -> ScalePool | str:
    """A Cluster API MachineDeployment, MachineSet or MachinePool that the autoscaler scales, as a pool."""
    metadata, spec = mapping_of(obj.get("metadata")), mapping_of(obj.get("spec"))
    annotations = _strings(metadata.get("annotations"))
    name = f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"
    if MIN_SIZE not in annotations or MAX_SIZE not in annotations:
        return "not autoscaled (no node-group min-size and max-size annotations)"
    if annotations.get(PAUSED) is not None or spec.get("paused") is True:
        return "paused: the autoscaler does not scale it"
    try:
        largest, count = int(annotations[MAX_SIZE]), int(annotations.get(GPU_COUNT, "0"))
    except ValueError as err:
        return f"metadata.annotations: {err}"
    resource = annotations.get(GPU_TYPE, "")
    if count <= 0 or not resource:
        dra = " (its GPUs come through DRA, dra-driver)" if DRA_DRIVER in annotations else ""
        return f"states no GPUs: {GPU_COUNT} and {GPU_TYPE} are needed{dra}"
    vendor = _VENDOR_OF.get(resource)
    if vendor is None:
        return f"{GPU_TYPE} {resource} is not a GPU resource this webhook knows"
    labels, taints = _group_labels(spec, annotations), _group_taints(spec, annotations)
    replicas = spec.get("replicas")
    replicas = replicas if type(replicas) is int else 0
    full = f"at its max size ({replicas} of {largest} nodes)" if replicas >= largest else ""
    memory = labels.get("nvidia.com/gpu.memory", "")
    try:
        cpu = cpu_milli(annotations[CPU]) if CPU in annotations else 0
        host = memory_mib(annotations[MEMORY]) if MEMORY in annotations else 0
    except QuantityError as err:
        return f"metadata.annotations: {err}"
    return ScalePool(name, labels, taints, gpu_model=labels.get("nvidia.com/gpu.product", ""), gpu_count=count,
                     memory_mib=int(memory) if memory.isdigit() else 0, vendor=vendor, kind=str(obj.get("kind")),
                     cpu_milli=cpu, host_memory_mib=host, full=full)


def _managed(key: str) -> bool:
    domain = key.split("/")[0] if "/" in key else ""
    return any(domain == d or domain.endswith("." + d) for d in _MANAGED[1:]) or domain == _MANAGED[0]


def _group_labels(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> dict[str, str]:
    template = mapping_of(spec.get("template"))
    labels = {k: v for source in (mapping_of(template.get("metadata")).get("labels"),
                                  mapping_of(mapping_of(template.get("spec")).get("metadata")).get("labels"))
              for k, v in _strings(source).items() if _managed(k)}
    for item in annotations.get(LABELS, "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            labels[key.strip()] = value.strip()
    return labels


def _group_taints(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> tuple[Taint, ...]:
    taints = [t for t in map(_taint, mapping_of(mapping_of(spec.get("template")).get("spec")).get("taints") or ()) if t]
    for item in annotations.get(TAINTS, "").split(","):
        head, _, effect = item.strip().partition(":")
        key, _, value = head.partition("=")
        if not key:
            continue
        taint = Taint(key, value, effect)
        same = [i for i, t in enumerate(taints) if (t.key, t.effect) == (key, effect)]
        if same:
            taints[same[0]] = taint
        else:
            taints.append(taint)
    return tuple(taints)


# -- all of them ----------------------------------------------------------------------------------------


def entry_of(obj: Mapping[str, Any]) -> tuple[int, ScalePool] | None:
    """The pool an object states with its weight (a NodePool's spec.weight, else 0), or None."""
    pool = read_pool(obj)
    return None if isinstance(pool, str) else (weight_of(obj), pool)


def ordered(entries: Iterable[tuple[int, ScalePool]], nodes: Iterable[Node]) -> tuple[ScalePool, ...]:
    """NodePools first, by weight (highest first) then name, with what their nodes hold; then node groups
    by namespace/name."""
    entries = list(entries)
    nodepools = sorted(((w, p) for w, p in entries if p.kind == NODEPOOL), key=lambda wp: (-wp[0], wp[1].name))
    groups = sorted((p for _, p in entries if p.kind != NODEPOOL), key=lambda p: (p.name, p.kind))
    made = list(nodes) if any(p.limits for _, p in nodepools) else []
    return (*(with_usage(p, made) for _, p in nodepools), *groups)


def pools_of(objects: Iterable[Mapping[str, Any]], nodes: Iterable[Node]) -> tuple[ScalePool, ...]:
    """The pools the objects state (`ordered`); objects that state none are left out."""
    return ordered([e for e in map(entry_of, objects) if e is not None], nodes)
