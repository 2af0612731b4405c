"""Kubernetes objects (plain dicts) -> the core's model: nodes, quotas, namespaces, running pods, snapshot.

Pure and client-free, so `check --cluster FILE`, the demo cluster and the live watch cache build the
very same Snapshot from the same objects. Errors are ValueError whose message starts with the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from webhook.core.admission.configmap_readers import TERMINAL_PHASES, env_reads, with_env_reads
from webhook.core.admission.dra import claim_refs, claim_users, held_usage, largest_card, read_claim
from webhook.core.admission.envfrom import env_from_keys
from webhook.core.domain.model import (
    Claim,
    EnvReader,
    Gpu,
    GpuUsage,
    Namespace,
    Node,
    NodeUsage,
    QuotaLimits,
    Snapshot,
    Taint,
    Usage,
    usage_of,
)
from webhook.core.domain.names import INVENTORY_ANNOTATION, QUOTA_CORES, QUOTA_GPUS, QUOTA_MEMORY
from webhook.core.domain.vendor_quota import quota_key
from webhook.core.placement.groups import SIZED_KINDS, merge_sizes, sizes_of
from webhook.core.placement.mig import offer_of, whole_cards
from webhook.core.podspec.hami_register import REGISTER_ANNOTATIONS, RegisterError, devices_of
from webhook.core.podspec.inventory import (
    inventory_from_json,
    mig_enabled_from_json,
    mig_from_json,
    toolkit_from_json,
    vendor_from_json,
)
from webhook.core.podspec.quantity import MIB, QuantityError, parse_quantity
from webhook.core.podspec.resources import parse_pod
from webhook.core.podspec.vendor_table import BY_NAME, VENDORS, classify_resource, device_kind
from webhook.core.policy.model import DRA_DEVICE_CLASSES

from .held import repeated
from .nodepools import POOL_KIND_NAMES, pools_of
from .observe import observed_of
from .podusage import PodUsage, place_usage, pod_usage_of

CLUSTER_KINDS = frozenset(
    {"Node", "Namespace", "ResourceQuota", "Pod", "GPUInventory", "ResourceClaim", "ResourceClaimTemplate",
     "ConfigMap", *(kind for _, kind in SIZED_KINDS), *POOL_KIND_NAMES}
)
# ResourceQuota keys per quota field; several spellings are in use (HAMi documents the bare names).
QUOTA_KEYS: Mapping[str, tuple[str, ...]] = {
    "gpus": (QUOTA_GPUS, "limits.nvidia.com/gpu", "nvidia.com/gpu"),
    "memory_mib": (QUOTA_MEMORY, "requests.nvidia.com/gpumem", "nvidia.com/gpumem"),
    "cores": (QUOTA_CORES, "requests.nvidia.com/gpucores", "nvidia.com/gpucores"),
}

Inventory = tuple[tuple[Gpu, ...], tuple[tuple[int, ...], ...], tuple[tuple[str, ...], ...]]


def is_cluster_kind(obj: object) -> bool:
    """True for the kinds a snapshot is built from; everything else in a cluster file is ignored."""
    return isinstance(obj, Mapping) and obj.get("kind") in CLUSTER_KINDS


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    name = _map(obj.get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name: required")
    return name


def _whole(value: object, field: str) -> int:
    """A non-negative whole quantity (GPU counts, MiB, percent)."""
    try:
        quantity = parse_quantity(value)
    except QuantityError as err:
        raise ValueError(f"{field}: {err}") from None
    if quantity.denominator != 1 or quantity < 0:
        raise ValueError(f"{field}: expected a whole number >= 0, got {value!r}")
    return int(quantity)


def _floor(value: object, field: str, scale: Fraction) -> int:
    try:
        return int(parse_quantity(value) * scale)
    except QuantityError as err:
        raise ValueError(f"{field}: {err}") from None


def inventory_of(spec: object) -> Inventory:
    """Check the inventory JSON (GPUInventory spec, or the Node annotation) and return its parts."""
    return inventory_from_json(spec, "spec")


def _pcie_unknown(size: int) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple("X" if i == j else "SYS" for j in range(size)) for i in range(size))


def _no_links(size: int) -> tuple[tuple[int, ...], ...]:
    return tuple((0,) * size for _ in range(size))


def _from_labels(name: str, labels: Mapping[str, str], allocatable: Mapping[str, Any]) -> tuple[Gpu, ...]:
    """GPU Feature Discovery labels; unknown links are PCIe SYS and no NVLink."""
    count: int | None = None
    if "nvidia.com/gpu.count" in labels:
        count = _whole(labels["nvidia.com/gpu.count"], "metadata.labels[nvidia.com/gpu.count]")
    advertised: int | None = None
    if "nvidia.com/gpu" in allocatable:
        advertised = _whole(allocatable["nvidia.com/gpu"], "status.allocatable[nvidia.com/gpu]")
    if not advertised and any(isinstance(k, str) and device_kind(k) for k in allocatable):
        # GFD counts MIG-mode and shared cards too; a node advertising only MIG devices, or replicas under a
        # name of their own (`nvidia.com/gpu.shared`), has no card for `nvidia.com/gpu` pods.
        return ()
    if advertised is not None:
        sharing = labels.get("nvidia.com/gpu.sharing-strategy", "none")
        # Time-slicing and MPS advertise replicas, not cards; otherwise fewer means unhealthy cards.
        if count is None:
            replicas = labels.get("nvidia.com/gpu.replicas", "1")
            count = advertised // max(1, _whole(replicas, "metadata.labels[nvidia.com/gpu.replicas]"))
        elif sharing == "none":
            count = min(count, advertised)
    if not count:
        return ()
    product = labels.get("nvidia.com/gpu.product", "unknown").removesuffix("-SHARED")
    memory = 0
    if "nvidia.com/gpu.memory" in labels:
        memory = _whole(labels["nvidia.com/gpu.memory"], "metadata.labels[nvidia.com/gpu.memory]")
    return tuple(Gpu(i, f"{name}-gpu-{i}", product, memory) for i in range(count))


def _other_vendor(name: str, allocatable: Mapping[str, Any]) -> tuple[str, tuple[Gpu, ...]]:
    """Cambricon / Hygon nodes, known only by the vendor resources they advertise."""
    for row in VENDORS:
        if row.vendor == "nvidia":
            continue
        totals: dict[str, int] = {}
        vendor = BY_NAME[row.vendor]
        model = vendor.device_model or row.vendor.upper()
        for key, value in allocatable.items():
            kind = classify_resource(key)
            if kind is None or kind[0] != row.vendor or kind[1] == "device":
                continue
            totals[kind[1]] = totals.get(kind[1], 0) + _whole(value, f"status.allocatable[{key}]") * kind[2]
            if "<model>" in (row.cores or "") and kind[1] in ("cores", "memory"):
                model = key.split("/", 1)[1].split(".", 1)[0].upper()
        cards = totals["cores"] // 100 if totals.get("cores") else totals.get("count", 0)
        if cards:
            memory = totals.get("memory", 0) // cards
            # HAMi's own device ids (`<node>-cambricon-mlu-<i>`), which cambricon.com/use-gpuuuid names.
            ids = name + (vendor.device_ids or f"-{row.vendor}-")
            return row.vendor, tuple(Gpu(i, f"{ids}{i}", model, memory) for i in range(cards))
    return "", ()


def node_of(node_obj: Mapping[str, Any], inventory_obj: Mapping[str, Any] | None = None) -> Node:
    """A Node (and its GPUInventory when there is one) as the core sees it."""
    name = _name(node_obj)
    metadata, spec, status = (_map(node_obj.get(k)) for k in ("metadata", "spec", "status"))
    labels = {str(k): str(v) for k, v in _map(metadata.get("labels")).items()}
    annotations = _map(metadata.get("annotations"))
    allocatable = _map(status.get("allocatable"))
    taints = []
    for i, taint in enumerate(spec.get("taints") or []):
        if not isinstance(taint, Mapping) or not isinstance(taint.get("key"), str):
            raise ValueError(f"spec.taints[{i}]: expected a mapping with a key")
        taints.append(Taint(taint["key"], str(taint.get("value") or ""), str(taint.get("effect") or "NoSchedule")))
    vendor, source = "nvidia", "none"
    gpus: tuple[Gpu, ...] = ()
    nvlink: tuple[tuple[int, ...], ...] = ()
    pcie: tuple[tuple[str, ...], ...] = ()
    toolkit: bool | None = None
    mig_devices: list[tuple[str, int]] = []
    if inventory_obj is not None:
        gpus, nvlink, pcie = inventory_of(inventory_obj.get("spec"))
        toolkit = toolkit_from_json(inventory_obj.get("spec"))
        vendor, mig_devices = vendor_from_json(inventory_obj.get("spec")), mig_from_json(inventory_obj.get("spec"))
        gpus, nvlink, pcie = whole_cards(gpus, nvlink, pcie, mig_enabled_from_json(inventory_obj.get("spec")))
        source = "inventory"
    elif INVENTORY_ANNOTATION in annotations:
        field = f"metadata.annotations[{INVENTORY_ANNOTATION}]"
        try:
            document = json.loads(annotations[INVENTORY_ANNOTATION])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{field}: not valid JSON ({err})") from None
        gpus, nvlink, pcie = inventory_from_json(document, field)
        vendor, mig_devices = vendor_from_json(document, field), mig_from_json(document)
        gpus, nvlink, pcie = whole_cards(gpus, nvlink, pcie, mig_enabled_from_json(document))
        source = "annotation"
    else:
        gpus = _from_labels(name, labels, allocatable)
        if not gpus:
            vendor, gpus = _other_vendor(name, allocatable)
            vendor = vendor or "nvidia"
            register = REGISTER_ANNOTATIONS.get(vendor)
            if gpus and register is not None and register in annotations:  # HAMi's record: UUIDs, models
                try:
                    gpus = devices_of(str(annotations[register]), f"metadata.annotations[{register}]")
                except RegisterError as err:
                    raise ValueError(str(err)) from None
        if gpus:
            source = "labels"
            nvlink, pcie = _no_links(len(gpus)), _pcie_unknown(len(gpus))
    return Node(
        name=name,
        gpus=gpus,
        nvlink=nvlink,
        pcie=pcie,
        vendor=vendor,
        cpu_milli=_floor(allocatable["cpu"], "status.allocatable.cpu", Fraction(1000)) if "cpu" in allocatable else 0,
        memory_mib=_floor(allocatable["memory"], "status.allocatable.memory", Fraction(1, MIB))
        if "memory" in allocatable
        else 0,
        labels=labels,
        taints=tuple(taints),
        unschedulable=spec.get("unschedulable") is True,
        inventory_source=source,
        toolkit_envvar=toolkit,
        mig=offer_of(labels, allocatable, mig_devices) if vendor == "nvidia" else {},
        gpu_units=_gpu_units(allocatable) if vendor == "nvidia" and gpus else None,
    )


def _gpu_units(allocatable: Mapping[str, Any]) -> int | None:
    """The `nvidia.com/gpu` units the node's device plugin advertises (None: it advertises none)."""
    if "nvidia.com/gpu" not in allocatable:
        return None
    return _whole(allocatable["nvidia.com/gpu"], "status.allocatable[nvidia.com/gpu]")


def claim_of(obj: Mapping[str, Any], kind: str | None = None) -> tuple[str, Claim]:
    """A ResourceClaim or ResourceClaimTemplate: its "namespace/name" key and what the core counts."""
    claim = read_claim(obj, kind)
    return f"{claim.namespace}/{claim.name}", claim


def config_map_of(obj: Mapping[str, Any]) -> tuple[str, str, frozenset[str]]:
    """A ConfigMap as the core sees it: namespace, name, and only the keys of `data` that envFrom could
    turn into a device or limit variable (core/admission/configmap_writes.py); values are never kept."""
    data = _map(obj).get("data")
    if data is not None and not isinstance(data, Mapping):
        raise ValueError("data: expected a mapping of keys to strings")
    namespace = str(_map(obj.get("metadata")).get("namespace") or "default")
    return namespace, _name(obj), env_from_keys(data)


def readers_of(table: Mapping[tuple[str, str, str], Iterable[str]]) -> dict[str, tuple[EnvReader, ...]]:
    """One namespace's ConfigMap -> readers (Snapshot.env_readers), from (ConfigMap, prefix, container) ->
    pod names, as `isolation.with_env_reads` counts them: the first pod by name, and how many."""
    found: dict[str, list[EnvReader]] = {}
    for (config_map, prefix, where), pods in table.items():
        names = list(pods)
        if names:
            found.setdefault(config_map, []).append(EnvReader(prefix, where, min(names), len(names)))
    return {name: tuple(sorted(readers)) for name, readers in found.items()}


def namespace_of(obj: Mapping[str, Any]) -> Namespace:
    labels = _map(_map(obj.get("metadata")).get("labels"))
    return Namespace(_name(obj), {str(k): str(v) for k, v in labels.items()})


def quotas_of(obj: Mapping[str, Any]) -> QuotaLimits:
    """A ResourceQuota's GPU keys; when several spellings of one key are set, the smallest applies."""
    hard = _map(_map(obj.get("spec")).get("hard"))
    values: dict[str, int | None] = {}
    for field, keys in QUOTA_KEYS.items():
        given = [_whole(hard[k], f"spec.hard[{k}]") for k in keys if k in hard]
        values[field] = min(given) if given else None
    others: dict[str, int] = {}
    for key, value in hard.items():
        found = quota_key(str(key), _whole(value, f"spec.hard[{key}]")) if isinstance(key, str) else None
        if found is not None:  # MIG profiles', Hygon's and Cambricon's keys; the smallest applies
            others[found[0]] = min(others.get(found[0], found[1]), found[1])
    return QuotaLimits(_name(obj), values["gpus"], values["memory_mib"], values["cores"], tuple(sorted(others.items())))


def host_usage_of(pod: Mapping[str, Any]) -> tuple[str | None, int, int]:
    """(node, cpu, memory) of a pod that holds no GPU but still occupies its node."""
    if _map(pod.get("status")).get("phase") in TERMINAL_PHASES:
        return None, 0, 0
    node = _map(pod.get("spec")).get("nodeName")
    if not isinstance(node, str) or not node:
        return None, 0, 0
    request = parse_pod(pod)
    return node, request.cpu_milli, request.memory_mib_host


def _placement_order(item: tuple[PodUsage | None, Mapping[str, Any]]) -> tuple[bool, str, str]:
    """Pods with recorded GPU indices first (the others' least-used choice must see them), then by
    namespace and name, so the snapshot does not depend on the order the objects arrived in."""
    use, pod = item
    metadata = _map(pod.get("metadata"))
    return use is None or use.gpus is None, str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def build_snapshot(objects: Iterable[Mapping[str, Any]], on_error: Callable[[str], None] | None = None, *,
                   dra_classes: tuple[str, ...] = DRA_DEVICE_CLASSES) -> Snapshot:
    """The core's Snapshot from Node, GPUInventory, Namespace, ResourceQuota and Pod objects.

    A malformed object raises ValueError ("Node n1: spec.taints[0]: ..."), or, when `on_error` is
    given (the live watch cache), is reported there and skipped (a bad inventory falls back to labels).
    """
    by_kind: dict[str, list[Mapping[str, Any]]] = {kind: [] for kind in CLUSTER_KINDS}
    for obj in objects:
        if is_cluster_kind(obj):
            by_kind[str(obj["kind"])].append(obj)
    guarded = _guard(on_error)
    nodes = _nodes_of(by_kind, guarded)
    uses = [(pod_usage_of(p), p) for p in by_kind["Pod"]]
    copies = repeated((u.node, u.nonce) for u, _ in uses if u is not None and u.gpus is not None and u.nonce)
    if copies:  # a record two pods present: neither's GPU indices are trusted (held.py)
        uses = [(replace(u, gpus=None) if u is not None and (u.node, u.nonce) in copies else u, p) for u, p in uses]
    usage, namespace_usage = _usage_of(nodes, uses)
    quotas: dict[str, list[QuotaLimits]] = {}
    for obj in by_kind["ResourceQuota"]:
        quota = guarded("ResourceQuota", obj, quotas_of)
        if quota is not None and (quota.gpus, quota.memory_mib, quota.cores) != (None, None, None):
            namespace = str(_map(obj.get("metadata")).get("namespace") or "default")
            quotas.setdefault(namespace, []).append(quota)
    claims: dict[str, dict[str, Claim]] = {"ResourceClaim": {}, "ResourceClaimTemplate": {}}
    for kind, table in claims.items():
        for obj in by_kind[kind]:
            found = guarded(kind, obj, claim_of)
            if found is not None:
                table[found[0]] = found[1]
    # What live pods hold through DRA claims (their resources name no GPU), counted like any GPU.
    holders = {str(i): (str(_map(p.get("metadata")).get("namespace") or "default"), refs)
               for i, p in enumerate(by_kind["Pod"]) if (refs := claim_refs(p))}
    for namespace, held in held_usage(holders, claims["ResourceClaim"], claims["ResourceClaimTemplate"],
                                      largest_card(nodes), dra_classes).items():
        namespace_usage[namespace] = namespace_usage.get(namespace, Usage()) + held
    users = claim_users(holders)
    config_maps: dict[str, dict[str, frozenset[str]]] = {}
    for obj in by_kind["ConfigMap"]:
        found_map = guarded("ConfigMap", obj, config_map_of)
        if found_map is not None:
            config_maps.setdefault(found_map[0], {})[found_map[1]] = found_map[2]
    env_readers = with_env_reads({}, (env_reads(p) for p in by_kind["Pod"]))
    # Multi-pod groups' sizes from their controllers' objects and PodGroups, as the watch cache keeps them
    # (an object of another API group that shares a kind's name, a batch/v1 Job, states none).
    group_sizes = merge_sizes(sizes_of(o) for kind in sorted({k for _, k in SIZED_KINDS}) for o in by_kind[kind])
    namespaces = {}
    for obj in by_kind["Namespace"]:
        namespace = guarded("Namespace", obj, namespace_of)
        if namespace is not None:
            namespaces[namespace.name] = namespace
    return Snapshot(
        nodes=nodes,
        usage=usage,
        namespaces=namespaces,
        quotas={ns: tuple(sorted(qs, key=lambda q: q.name)) for ns, qs in quotas.items()},
        namespace_usage=namespace_usage,
        claims=claims["ResourceClaim"],
        claim_users=users,
        claim_templates=claims["ResourceClaimTemplate"],
        config_maps=config_maps,
        env_readers=env_readers,
        group_sizes=group_sizes,
        # Karpenter NodePools and Cluster API node groups that scale from zero, as the watch cache reads them
        scale_pools=pools_of((o for kind in sorted(POOL_KIND_NAMES) for o in by_kind[kind]), nodes.values()),
        observed=observed_of(uses, nodes),
    )


Guard = Callable[..., Any]


def _guard(on_error: Callable[[str], None] | None) -> Guard:
    """`guarded(kind, obj, build, *args)`: `build(obj, *args)`, whose ValueError is raised again naming the
    object ("Node n1: ..."), or, with `on_error`, reported there and answered with None."""

    def guarded(kind: str, obj: Mapping[str, Any], build: Callable[..., Any], *args: Any) -> Any:
        try:
            return build(obj, *args)
        except ValueError as err:
            name = _map(obj.get("metadata")).get("name", "?")
            message = f"{kind} {name}: {err}"
            if on_error is None:
                raise ValueError(message) from None
            on_error(message)
            return None

    return guarded


def _nodes_of(by_kind: Mapping[str, list[Mapping[str, Any]]], guarded: Guard) -> dict[str, Node]:
    """The Nodes, each with its GPUInventory when it has a readable one (else read from its labels)."""
    inventories = {_map(o.get("metadata")).get("name"): o for o in by_kind["GPUInventory"]}
    nodes: dict[str, Node] = {}
    for obj in by_kind["Node"]:
        name = _map(obj.get("metadata")).get("name")
        inventory = inventories.get(name)
        node = guarded("GPUInventory" if inventory else "Node", obj, node_of, inventory)
        if node is None and inventory is not None:
            node = guarded("Node", obj, node_of)
        if node is not None:
            nodes[node.name] = node
    return nodes


def _usage_of(nodes: Mapping[str, Node], uses: list[tuple[PodUsage | None, Mapping[str, Any]]],
              ) -> tuple[dict[str, NodeUsage], dict[str, Usage]]:
    """Each node's usage and each namespace's GPU usage, the pods added up in placement order."""
    gpu_use: dict[str, list[GpuUsage]] = {n: [GpuUsage()] * len(node.gpus) for n, node in nodes.items()}
    host: dict[str, list[int]] = {n: [0, 0, 0] for n in nodes}  # cpu, memory, GPU tasks
    namespace_usage: dict[str, Usage] = {}
    for use, pod in sorted(uses, key=_placement_order):
        if use is None:
            node_name, cpu, memory = host_usage_of(pod)
            if node_name in host:
                host[node_name][0] += cpu
                host[node_name][1] += memory
            continue
        card = 0
        if use.node in nodes:
            node = nodes[use.node]
            place_usage(node, gpu_use[use.node], use)
            card = node.gpus[0].memory_mib if node.gpus else 0
            host[use.node][0] += use.cpu_milli
            host[use.node][1] += use.memory_mib_host
            host[use.node][2] += 1
        taken = usage_of(use.vendor, use.mig, use.count, use.memory_on(card) * use.count, use.cores * use.count)
        namespace_usage[use.namespace] = namespace_usage.get(use.namespace, Usage()) + taken
    usage = {n: NodeUsage(tuple(gpu_use[n]), host[n][0], host[n][1], host[n][2]) for n in nodes}
    return usage, namespace_usage
