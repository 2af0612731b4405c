"""Capacity that does not exist yet: node pools that scale from zero, and pods that ask for capacity to be
provisioned for them.

Cluster-autoscaler (scale from zero), Karpenter NodePools and GKE's ProvisioningRequests (DWS, through
Kueue's provisioning admission check) make a node only after a pod exists that needs it. A pod that no
existing node can host, but a pool could (policy `capacity.scaleFromZero`, or a NodePool or Cluster API
node group read from the cluster: `Snapshot.scale_pools`), or that consumes a ProvisioningRequest, is
therefore admitted to wait: placement is left to the scheduler and the autoscaler, and the pod gets the
limits it would get on the pool's card.

A pool is judged as the node it would make: its labels against the pod's nodeSelector and required node
affinity, its taints against the pod's tolerations (with those the mutation adds), its GPUs against the
request (vendor, count, memory per GPU, model filters and the namespace's allowedModels). A pool at the end
of its limits (a NodePool's `spec.limits`, a node group at its max size) makes no node.

A Karpenter NodePool is matched as Karpenter matches it (sigs.k8s.io/karpenter
`pkg/scheduling/requirements.go`, `Compatible` and `Intersects`): its template labels and requirements
against the pod's nodeSelector and one required node affinity term; a key the pod requires must be one the
NodePool defines, unless it is a well-known label (the instance type decides it) or the pod's operator is
NotIn or DoesNotExist. Its GPUs are what the requirements on the providers' GPU labels (the NodePool's
and the pod's together) allow; what they leave open is unknown, and Karpenter may launch any instance type
they allow, so every GPU name allowed must pass the pod's model filters and every memory size its slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from webhook.core.domain.model import Allocation, Gpu, Node, ScalePool
from webhook.core.domain.podview import PodView
from webhook.core.domain.request import PodRequest
from webhook.core.placement.nodeconstraints import NodeConstraints, Term, parse_int64
from webhook.core.podspec.vendor_table import COUNT_RESOURCES
from webhook.core.podspec.view import labels_and_annotations

# Pods consuming a ProvisioningRequest: cluster-autoscaler's keys (current and the earlier ones that Kueue
# and GKE still write). Such a pod waits for the node the request provisions.
PROVISIONING_ANNOTATIONS = (
    "autoscaling.x-k8s.io/consume-provisioning-request",
    "cluster-autoscaler.kubernetes.io/consume-provisioning-request",
)
AWAITING = "awaiting-capacity"  # the decision's reason when the pod waits for a node to be made
NODEPOOL = "NodePool"  # ScalePool.kind of a Karpenter NodePool

# The labels Karpenter knows from the instance type: a pod may require one its NodePool leaves open
# (sigs.k8s.io/karpenter pkg/apis/v1/labels.go WellKnownLabels, and those the AWS and Azure providers add
# in their pkg/apis/v1/labels.go).
_AWS, _AZURE = "karpenter.k8s.aws/", "karpenter.azure.com/"
WELL_KNOWN = frozenset({
    "karpenter.sh/nodepool", "karpenter.sh/capacity-type", "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region", "node.kubernetes.io/instance-type", "kubernetes.io/arch", "kubernetes.io/os",
    "node.kubernetes.io/windows-build", "topology.k8s.aws/zone-id",
    *(_AWS + n for n in (
        "capacity-reservation-id", "capacity-reservation-type", "instance-hypervisor",
        "instance-encryption-in-transit-supported", "instance-category", "instance-family", "instance-generation",
        "instance-size", "instance-local-nvme", "instance-cpu", "instance-cpu-manufacturer",
        "instance-cpu-sustained-clock-speed-mhz", "instance-memory", "instance-ebs-bandwidth",
        "instance-network-bandwidth", "instance-gpu-name", "instance-gpu-manufacturer", "instance-gpu-count",
        "instance-gpu-memory", "instance-accelerator-name", "instance-accelerator-manufacturer",
        "instance-accelerator-count")),
    *(_AZURE + n for n in (
        "sku-name", "sku-family", "sku-series", "sku-version", "sku-cpu", "sku-memory", "sku-networking-accelerated",
        "sku-storage-premium-capable", "sku-storage-ephemeralos-maxsize", "sku-gpu-name", "sku-gpu-manufacturer",
        "sku-gpu-count")),
    "kubernetes.azure.com/cluster", "kubernetes.azure.com/mode", "kubernetes.azure.com/scalesetpriority",
})
# Pod label keys Karpenter reads as another (its NormalizedLabels)
_NORMALISED = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
    "beta.kubernetes.io/arch": "kubernetes.io/arch", "beta.kubernetes.io/os": "kubernetes.io/os",
    "beta.kubernetes.io/instance-type": "node.kubernetes.io/instance-type",
}
# The providers' GPU labels: count, name, manufacturer and memory per GPU (MiB; AWS only).
GPU_COUNT = (_AWS + "instance-gpu-count", _AZURE + "sku-gpu-count")
GPU_NAME = (_AWS + "instance-gpu-name", _AZURE + "sku-gpu-name")
GPU_MAKER = (_AWS + "instance-gpu-manufacturer", _AZURE + "sku-gpu-manufacturer")
GPU_MEMORY = (_AWS + "instance-gpu-memory",)
# Labels whose values say whether an instance has GPUs: EC2's GPU categories (g, p), families and instance
# types starting with them, Azure's N-series (sku-family N..., instance types Standard_N...).
_GPU_CATEGORIES = {_AWS + "instance-category": ("g", "p")}
_GPU_PREFIXES = {_AWS + "instance-family": ("g", "p"), "node.kubernetes.io/instance-type": ("g", "p", "Standard_N"),
                 _AZURE + "sku-family": ("N",), _AZURE + "sku-name": ("Standard_N",)}


@dataclass(frozen=True)
class Awaiting:
    """Where an admitted pod's node will come from: a pool (`pool`, and `node`, the node it would make),
    or a ProvisioningRequest (`request`) with no pool known."""

    pool: ScalePool | None
    node: Node | None
    request: str = ""

    @property
    def source(self) -> str:
        if self.pool is not None:
            return f"{self.pool.kind or 'pool'} {self.pool.name}"
        return f"the autoscaler (ProvisioningRequest {self.request})"

    @property
    def note(self) -> str:
        return f"no node can host it now; it waits for capacity from {self.source}"

    def stamp(self, allocation: Allocation) -> Allocation:
        """The allocation, its record naming the pool (ScalePool.ref) or ProvisioningRequest waited for."""
        return replace(allocation, awaiting_pool=self.pool.ref if self.pool is not None else "",
                       awaiting_request=self.request)


def provisioning_request(pod: Mapping[str, Any] | PodView) -> str:
    """The ProvisioningRequest the pod consumes ("" when none)."""
    annotations = labels_and_annotations(pod)[1]
    for key in PROVISIONING_ANNOTATIONS:
        value = annotations.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def pools_of(declared: tuple[ScalePool, ...], read: tuple[ScalePool, ...]) -> tuple[ScalePool, ...]:
    """The policy's pools, then those read from the cluster whose names the policy does not use."""
    if not read:
        return declared
    names = {p.name for p in declared}
    return declared + tuple(p for p in read if p.name not in names)


def pool_node(pool: ScalePool) -> Node:
    """The node a pool would make: its labels, taints and GPUs (no links known)."""
    gpus = tuple(Gpu(i, "", pool.gpu_model, pool.memory_mib) for i in range(pool.gpu_count))
    return Node(f"({pool.ref})", gpus=gpus, vendor=pool.vendor, labels=pool.labels, taints=pool.taints,
                cpu_milli=pool.cpu_milli, memory_mib=pool.host_memory_mib)


def _matches(model: str, patterns: tuple[str, ...]) -> bool:
    lowered = model.lower()
    return any(p.strip().lower() in lowered for p in patterns if p.strip())


def misfit(request: PodRequest, pool: ScalePool, constraints: NodeConstraints,
           allowed_models: tuple[str, ...] = ()) -> str:
    """Why the pool's nodes could never host the request ("" when they could)."""
    return fit(request, pool, constraints, allowed_models)[0]


def fit(request: PodRequest, pool: ScalePool, constraints: NodeConstraints,
        allowed_models: tuple[str, ...] = ()) -> tuple[str, Node | None]:
    """Why the pool's nodes could never host the request ("" when they could), else the node it makes."""
    if pool.full:
        return pool.full, None
    why = _beyond_limits(request, pool)
    if why:
        return why, None
    if pool.kind == NODEPOOL:
        return _karpenter_fit(request, pool, constraints, allowed_models)
    if pool.vendor != request.vendor:
        return f"{pool.vendor} GPUs", None
    reason = constraints.refusal(pool_node(pool))
    if reason:
        return f"its nodes fail the pod's {constraints.describe(reason)}", None
    model = pool.gpu_model
    if request.models_include and not _matches(model, request.models_include):
        return f"model {model or '(not declared)'} is not {', '.join(request.models_include)}", None
    if request.models_exclude and model and _matches(model, request.models_exclude):
        return f"model {model} is excluded", None
    if allowed_models and not _matches(model, allowed_models):
        return f"model {model or '(not declared)'} is not among allowedModels {', '.join(allowed_models)}", None
    if request.gpus > pool.gpu_count:
        return f"{pool.gpu_count} GPUs per node", None
    if request.memory_mib and request.memory_mib > pool.memory_mib:
        known = f"{pool.memory_mib} MiB" if pool.memory_mib else "undeclared memory"
        return f"cards of {known}", None
    if request.shared and not pool.memory_mib:  # HAMi-core could not bound a slice of it
        return "cards of undeclared memory: a GPU slice could not be bounded (ask for whole GPUs)", None
    why = _host_fit(request, pool) or _uuid_fit(request)
    return (why, None) if why else ("", pool_node(pool))


def _host_fit(request: PodRequest, pool: ScalePool) -> str:
    if 0 < pool.cpu_milli < request.cpu_milli:
        return f"nodes of {pool.cpu_milli / 1000:g} CPUs"
    if 0 < pool.host_memory_mib < request.memory_mib_host:
        return f"nodes of {pool.host_memory_mib} MiB memory"
    return ""


def _uuid_fit(request: PodRequest) -> str:
    return "a new node has none of the GPU UUIDs asked for" if request.uuids_include else ""


def _amount(resource: str, value: int) -> str:
    if resource == "cpu":
        return f"{value / 1000:g}"
    return f"{value}Mi" if resource == "memory" else str(value)


def _beyond_limits(request: PodRequest, pool: ScalePool) -> str:
    """A NodePool whose spec.limits leave no room for a node that could host the request: Karpenter
    launches only instance types that fit in what its limits leave (its nodes counted)."""
    for resource, limit in pool.limits.items():
        if resource == COUNT_RESOURCES.get(request.vendor):
            need = request.gpus
        elif resource in ("cpu", "memory"):
            need = max(request.cpu_milli if resource == "cpu" else request.memory_mib_host, 1)
        else:
            continue
        used = pool.used.get(resource, 0)
        if limit - used < need:
            return (f"its limit {resource}: {_amount(resource, limit)} is used up by its nodes "
                    f"({_amount(resource, used)}), leaving {_amount(resource, max(limit - used, 0))}")
    return ""


# -- Karpenter's requirements ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Allowed:
    """The values one label may take (sigs.k8s.io/karpenter scheduling.Requirement): `values`, or all
    but them when `complement`; and, for integers, the bounds `above` (Gt) and `below` (Lt)."""

    complement: bool
    values: frozenset[str] = frozenset()
    above: int | None = None
    below: int | None = None

    @classmethod
    def of(cls, operator: str, values: tuple[str, ...]) -> Allowed:
        bound = parse_int64(values[0]) if len(values) == 1 else None
        if operator in ("In", "NotIn"):
            return cls(operator == "NotIn", frozenset(values))
        if operator in ("Gt", "Lt") and bound is not None:
            return cls(True, above=bound) if operator == "Gt" else cls(True, below=bound)
        return cls(operator == "Exists")  # DoesNotExist; a malformed Gt / Lt allows no value either

    @property
    def empty(self) -> bool:
        return not self.complement and not self.values

    @property
    def excludes(self) -> bool:
        """NotIn or DoesNotExist, as Karpenter's Operator() names it."""
        return self.complement == bool(self.values)

    def has(self, value: str) -> bool:
        return (value in self.values) != self.complement and self._within(value)

    def _within(self, value: str) -> bool:
        if self.above is None and self.below is None:
            return True
        number = parse_int64(value)
        return number is not None and (self.above is None or number > self.above) and (
            self.below is None or number < self.below)

    def __and__(self, other: Allowed) -> Allowed:
        above = max((b for b in (self.above, other.above) if b is not None), default=None)
        below = min((b for b in (self.below, other.below) if b is not None), default=None)
        if above is not None and below is not None and above >= below:
            return Allowed(False)
        if self.complement and other.complement:
            values = self.values | other.values
        elif self.complement:
            values = other.values - self.values
        elif other.complement:
            values = self.values - other.values
        else:
            values = self.values & other.values
        complement = self.complement and other.complement
        bounded = Allowed(complement, frozenset(), above, below)
        values = frozenset(v for v in values if bounded._within(v))
        return Allowed(True, values, above, below) if complement else Allowed(False, values)

    def numbers(self) -> list[int] | None:
        """The integers allowed, when they are a list (None: open-ended)."""
        if self.complement:
            return None
        return sorted(n for n in (parse_int64(v) for v in self.values) if n is not None)

    def text(self) -> str:
        if not self.complement:
            return f"In [{', '.join(sorted(self.values))}]" if self.values else "DoesNotExist"
        bounds = [f"Gt {self.above}"] * (self.above is not None) + [f"Lt {self.below}"] * (self.below is not None)
        return " ".join([f"NotIn [{', '.join(sorted(self.values))}]"] * bool(self.values) + bounds) or "Exists"


Requirements = dict[str, Allowed]


def _add(table: Requirements, key: str, allowed: Allowed) -> None:
    table[key] = table[key] & allowed if key in table else allowed


def nodepool_requirements(pool: ScalePool) -> Requirements:
    """A NodePool's requirements with its template labels (and its own name) as In requirements."""
    table: Requirements = {}
    for key, value in pool.labels.items():
        _add(table, key, Allowed(False, frozenset((value,))))
    for key, operator, values in pool.requirements:
        _add(table, key, Allowed.of(operator, values))
    return table


def pod_requirements(constraints: NodeConstraints, term: Term | None) -> Requirements:
    """The pod's nodeSelector and one required node affinity term, as Karpenter reads them."""
    table: Requirements = {}
    for key, value in constraints.selector:
        _add(table, _NORMALISED.get(key, key), Allowed(False, frozenset(() if value is None else (value,))))
    for r in term.expressions if term is not None else ():
        _add(table, _NORMALISED.get(r.key, r.key), Allowed.of(r.operator, r.values))
    return table


def incompatible(nodepool: Requirements, pod: Requirements) -> str:
    """Karpenter's Compatible: why the NodePool's nodes can never meet the pod's requirements ("")."""
    for key, wanted in pod.items():
        have = nodepool.get(key)
        if have is None:
            if key not in WELL_KNOWN and not wanted.excludes:
                return f"the pod requires {key} {wanted.text()}, a label the NodePool does not define"
            continue
        if (have & wanted).empty and not (wanted.excludes and have.excludes):
            return f"the pod requires {key} {wanted.text()}, the NodePool {have.text()}"
    return ""


def _karpenter_fit(request: PodRequest, pool: ScalePool, constraints: NodeConstraints,
                   allowed_models: tuple[str, ...]) -> tuple[str, Node | None]:
    taint = constraints.untolerated(Node("", taints=pool.taints))
    if taint is not None:
        shown = f"{taint.key}={taint.value}" if taint.value else taint.key
        return f"its nodes' taint {shown}:{taint.effect} is not tolerated", None
    nodepool = nodepool_requirements(pool)
    first = ""
    # Karpenter tries the pod's required terms one at a time (it relaxes the others away)
    for term in constraints.required if constraints.required is not None else (None,):
        if term is not None and (term.error or term.fields):
            why = f"a new node cannot meet the term ({term.text()})"
        else:
            pod = pod_requirements(constraints, term)
            why = incompatible(nodepool, pod)
            if not why:
                combined = dict(nodepool)
                for key, allowed in pod.items():
                    _add(combined, key, allowed)
                why, node = _karpenter_gpus(request, pool, combined, allowed_models)
                if node is not None:
                    return "", node
        first = first or why
    return first, None


def _one(table: Requirements, keys: tuple[str, ...]) -> tuple[str, Allowed | None]:
    for key in keys:
        if key in table:
            return key, table[key]
    return keys[0], None


def _no_gpu_instances(table: Requirements) -> str:
    """A requirement that allows no GPU instance ("" when GPU instances remain possible)."""
    for key, gpu in _GPU_CATEGORIES.items():
        allowed = table.get(key)
        if allowed is not None and not any(allowed.has(v) for v in gpu):
            return f"{key} {allowed.text()} allows no GPU instance"
    for key, prefixes in _GPU_PREFIXES.items():
        allowed = table.get(key)
        if allowed is not None and not allowed.complement and not any(
                v.startswith(prefixes) for v in allowed.values):
            return f"{key} {allowed.text()} allows no GPU instance"
    return ""


def _karpenter_gpus(request: PodRequest, pool: ScalePool, table: Requirements,
                    allowed_models: tuple[str, ...]) -> tuple[str, Node | None]:
    why = _no_gpu_instances(table) or _karpenter_vendor(request, table)
    if why:
        return why, None
    key, counts = _one(table, GPU_COUNT)
    numbers = counts.numbers() if counts is not None else None
    if counts is not None and not _some_at_least(counts, request.gpus):
        return f"{key} {counts.text()} allows no instance with {request.gpus} GPUs", None
    count = min((n for n in numbers or () if n >= request.gpus), default=request.gpus)
    why, model = _karpenter_model(request, table, allowed_models)
    if why:
        return why, None
    why, card = _karpenter_memory(request, table)
    if why:
        return why, None
    why = _host_fit(request, pool) or _uuid_fit(request)
    if why:
        return why, None
    labels = {k: next(iter(a.values)) for k, a in table.items() if not a.complement and len(a.values) == 1}
    gpus = tuple(Gpu(i, "", model, card) for i in range(count))
    return "", Node(f"({pool.ref})", gpus=gpus, vendor=request.vendor, labels=labels, taints=pool.taints)


def _some_at_least(allowed: Allowed, least: int) -> bool:
    numbers = allowed.numbers()
    if numbers is not None:
        return any(n >= least for n in numbers)
    return allowed.below is None or allowed.below - 1 >= least  # finitely many values excluded


def _karpenter_vendor(request: PodRequest, table: Requirements) -> str:
    key, makers = _one(table, GPU_MAKER)
    if makers is not None and not makers.has(request.vendor):
        return f"{key} {makers.text()} allows no {request.vendor} GPU"
    return ""


def _karpenter_model(request: PodRequest, table: Requirements, allowed_models: tuple[str, ...]) -> tuple[str, str]:
    """The GPU model the node will have ("" when several are possible), or why it may not be the one asked."""
    key, names = _one(table, GPU_NAME)
    candidates = sorted(names.values) if names is not None and not names.complement else None
    if candidates is None:
        if request.models_include or allowed_models:
            wanted = ", ".join(request.models_include or allowed_models)
            return (f"its GPU model is not fixed (no {key} In [...] in the NodePool or the pod), so it may not "
                    f"be {wanted}"), ""
        return "", ""
    for name in candidates:
        if request.models_include and not _matches(name, request.models_include):
            return f"{key} {names.text() if names else ''} allows {name}, not {', '.join(request.models_include)}", ""
        if request.models_exclude and _matches(name, request.models_exclude):
            return f"{key} allows {name}, which the pod excludes", ""
        if allowed_models and not _matches(name, allowed_models):
            return f"{key} allows {name}, not among allowedModels {', '.join(allowed_models)}", ""
    return "", candidates[0] if len(candidates) == 1 else ""


def _karpenter_memory(request: PodRequest, table: Requirements) -> tuple[str, int]:
    """Each card's memory when only one size is possible (0: unknown), or why a slice cannot be bounded."""
    key, sizes = _one(table, GPU_MEMORY)
    numbers = sizes.numbers() if sizes is not None else None
    least = min(numbers) if numbers else (sizes.above + 1 if sizes is not None and sizes.above is not None else 0)
    card = numbers[0] if numbers and len(numbers) == 1 else 0
    if sizes is not None and numbers == []:
        return f"{key} {sizes.text()} allows no GPU memory size", 0
    if request.memory_mib and least and request.memory_mib > least:
        return f"{key} {sizes.text() if sizes else ''} allows cards of {least} MiB", 0
    if request.shared and not card and not (request.memory_mib and least):
        return (f"cards of unknown memory (the NodePool states no single {key}): a GPU slice could not be "
                "bounded (ask for whole GPUs, or select the memory)"), 0
    return "", card


# -- the pools considered --------------------------------------------------------------------------------


def pool_for(request: PodRequest, pools: tuple[ScalePool, ...], constraints: NodeConstraints,
             allowed_models: tuple[str, ...] = ()) -> tuple[Awaiting | None, dict[str, str]]:
    """The first pool that could host the request (with the node it would make), and why each one
    before it could not."""
    misfits: dict[str, str] = {}
    for pool in pools:
        why, node = fit(request, pool, constraints, allowed_models)
        if node is not None:
            return Awaiting(pool, node), misfits
        misfits[pool.ref] = why
    return None, misfits


def considered(misfits: Mapping[str, str]) -> str:
    """The pools considered and why none fits, for a refusal's message ("" when none is declared)."""
    if not misfits:
        return ""
    return "; no scale-from-zero pool fits either (" + "; ".join(f"{n}: {w}" for n, w in misfits.items()) + ")"
