"""The policy file: defaults, per-namespace rules and behaviour under pressure.

Parsed and checked once at load; every error names the field (`namespaces.team-a.maxGpusPerPod`), so a
bad ConfigMap is refused with a message the operator can act on instead of half-applied.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.core.domain.model import DEFAULT_TOPOLOGY_LOSS, ScalePool, Taint, TopologyClass
from webhook.core.domain.names import GPU_PLACEMENTS, PLACEMENT_POLICIES
from webhook.core.domain.request import TopologyPreference
from webhook.core.podspec.vendor_table import COUNT_RESOURCES, is_gpu_resource

BUILTIN_PLACEMENTS = PLACEMENT_POLICIES
SLICE_DEFAULTS = ("hami", "proportional")
BACKENDS = ("hami-core", "mps", "none")
WHEN_FULL = ("admit", "deny")
ON_STALE = ("deny", "allow")
MANAGED_MODES = ("labelled", "all")
# NVIDIA's DRA driver for GPUs: whole GPUs, MIG devices, and GPUs bound to vfio-pci for passthrough (a
# VM's GPU is a GPU). Its ComputeDomain classes hand out IMEX channels, no GPU.
DRA_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
GPU_RUNTIME_CLASSES = ("nvidia", "nvidia-cdi", "nvidia-legacy")  # the GPU operator's RuntimeClasses
ISOLATION_ACTIONS = ("neutralise", "deny")
# Unread envFrom sources (Secrets): `warn` admits GPU containers with a warning only, for platforms that
# control who writes Secrets (core/admission/envfrom.py).
ENV_FROM_ACTIONS = ("neutralise", "deny", "warn")
# Multi-pod groups (core/group_place.py): node labels naming topology domains, innermost first, and
# whether a group must stay in one domain. "preferred" by default: a cluster whose groups run across
# domains today keeps admitting them (split, with a warning) instead of refusing them on upgrade.
GROUP_LEVELS = ("nvidia.com/gpu.clique", "topology.kubernetes.io/rack", "topology.kubernetes.io/zone")
GROUP_MODES = ("required", "preferred", "none")

PlacementSpec = str | Mapping[str, float]


class PolicyError(ValueError):
    """A policy field is wrong. `field` is its dotted path."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


@dataclass(frozen=True)
class NamespaceRule:
    """Per-namespace over-allocation rules; None means "no rule", falling back to the defaults."""

    max_gpus_per_pod: int | None = None
    allowed_models: tuple[str, ...] = ()  # case-insensitive substrings of the GPU model; empty: any
    allow_sharing: bool = True
    placement: PlacementSpec | None = None
    backend: str | None = None
    group_topology: str | None = None  # required | preferred | none for the namespace's groups


MIX_SOURCES = ("learn", "default")  # workloadMix's names; a list is a fixed mix


@dataclass(frozen=True)
class MixEntry:
    """One pod shape of a fixed workload mix for the fragmentation policy."""

    gpus: int
    milli: int
    weight: float


_NO_RULE = NamespaceRule()  # a namespace without a rule of its own (frozen: shared safely)


class Compiled:
    """What admission derives from one policy and keeps with it: the placement context for each namespace
    and pod choice (`admission.admit`), made on first use."""

    __slots__ = ("contexts",)
    LIMIT = 4096  # distinct (namespace, pod choice) pairs kept; all are dropped beyond

    def __init__(self) -> None:
        self.contexts: dict[tuple[Any, ...], Any] = {}


@dataclass(frozen=True)
class Policy:
    """Everything configurable about admission. `Policy()` is the documented default."""

    placement: PlacementSpec = "binpack"
    gpu_placement: str = "binpack"
    topology: TopologyPreference = TopologyPreference.PREFERRED
    backend: str = "hami-core"
    # Slices a pod leaves half-given, as HAMi fills them ("hami": no memory given, the whole card's; no cores
    # given, no compute cap, or the whole card when the memory is) or "proportional" (the missing figure
    # takes the same share of the chosen card as the given one).
    slice_defaults: str = "hami"
    memory_percent: int | None = None  # only cores given: this % of the card; None: per slice_defaults
    cores_percent: int | None = None  # only memory given: this % of SMs; None: per slice_defaults
    tolerations: tuple[Mapping[str, Any], ...] = ()
    preferred_nodes: int = 5
    max_affinity_nodes: int = 200  # above this, required affinity names GPU models instead of nodes
    topology_loss: Mapping[TopologyClass, float] = field(default_factory=lambda: dict(DEFAULT_TOPOLOGY_LOSS))
    when_full: str = "admit"
    managed_namespaces: str = "labelled"
    stale_after_seconds: float = 90.0
    stale_grace_seconds: float = 120.0
    on_stale: str = "deny"
    reservation_ttl_seconds: float = 120.0
    workload_mix: tuple[MixEntry, ...] = ()
    # Where the fragmentation policy's mix comes from: "learn" (the GPU pods the cluster holds, see
    # core/mixlearn.py), "default" (fragmentation.default_mix) or "fixed" (`workload_mix`).
    workload_mix_source: str = "learn"
    # DRA: device classes whose devices are GPUs (counted against quotas and rules), and extended
    # resources that a DeviceClass serves through DRA and the vendor table does not know (whole GPUs).
    dra_device_classes: tuple[str, ...] = DRA_DEVICE_CLASSES
    dra_extended_resources: tuple[str, ...] = ()
    # Isolation (core/admission/no_gpu_reach.py, envfrom.py): RuntimeClasses that run the NVIDIA
    # hook; what to do with envFrom sources the webhook cannot read (Secrets, ConfigMaps not seen) and
    # with a pod that asks for no GPU but can reach one (GPU RuntimeClass, GPU taint tolerated, nodeName
    # of a GPU node).
    gpu_runtime_classes: tuple[str, ...] = GPU_RUNTIME_CLASSES
    unresolved_env_from: str = "neutralise"
    non_gpu_access: str = "neutralise"
    namespaces: Mapping[str, NamespaceRule] = field(default_factory=dict)
    group_levels: tuple[str, ...] = GROUP_LEVELS
    group_topology: str = "preferred"
    # Node pools that scale from zero (policy `capacity.scaleFromZero`): pods they could host wait for them.
    scale_from_zero: tuple[ScalePool, ...] = ()
    # Custom scorers by name (from the `gpu_admission.scorers` entry points); not part of equality.
    scorers: Mapping[str, Callable[..., float]] = field(default_factory=dict, compare=False, repr=False)
    # What admission compiles from this policy, once (its placement contexts). Not an argument: a policy
    # made by `dataclasses.replace` starts with its own, empty.
    compiled: Compiled = field(default_factory=lambda: Compiled(), init=False, compare=False, repr=False)

    def rule(self, namespace: str) -> NamespaceRule:
        return self.namespaces.get(namespace, _NO_RULE)

    def placement_for(self, namespace: str) -> PlacementSpec:
        return self.rule(namespace).placement or self.placement

    def backend_for(self, namespace: str) -> str:
        return self.rule(namespace).backend or self.backend

    def group_topology_for(self, namespace: str) -> str:
        return self.rule(namespace).group_topology or self.group_topology


# --------------------------------------------------------------------------------------------- parsing


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PolicyError(path, f"expected a mapping, got {type(value).__name__}")
    return value


# Every field of the policy file, by where it sits ("namespaces.*": each namespace's rule, "x[]": each item
# of the list x). The parser refuses any other; the chart's values schema is generated from this table
# (tests/chart/test_chart_policy_schema.py), so a misspelled field fails `helm install` too.
POLICY_FIELDS: Mapping[str, tuple[str, ...]] = {
    "": ("defaults", "topologyLoss", "whenFull", "managedNamespaces", "stale", "reservations", "workloadMix",
         "namespaces", "dra", "isolation", "groupTopology", "capacity"),
    "defaults": ("placement", "gpuPlacement", "topology", "backend", "sliceDefaults", "memoryPercent",
                 "coresPercent", "tolerations", "preferredNodes", "maxAffinityNodes"),
    "defaults.tolerations[]": ("key", "operator", "value", "effect", "tolerationSeconds"),
    "namespaces.*": ("maxGpusPerPod", "allowedModels", "allowSharing", "placement", "backend", "groupTopology"),
    "groupTopology": ("levels", "mode"),
    "dra": ("deviceClasses", "extendedResources"),
    "topologyLoss": tuple(c.value for c in DEFAULT_TOPOLOGY_LOSS if c is not TopologyClass.SINGLE),
    "stale": ("afterSeconds", "graceSeconds", "action"),
    "reservations": ("ttlSeconds",),
    "workloadMix[]": ("gpus", "milli", "weight"),
    "isolation": ("gpuRuntimeClasses", "unresolvedEnvFrom", "nonGpuAccess"),
    "capacity": ("scaleFromZero",),
    "capacity.scaleFromZero[]": ("name", "labels", "taints", "gpu"),
    "capacity.scaleFromZero[].taints[]": ("key", "value", "effect"),
    "capacity.scaleFromZero[].gpu": ("model", "count", "memoryMiB", "vendor"),
}


def _known(data: Mapping[str, Any], path: str, keys: tuple[str, ...]) -> None:
    for key in data:
        if key not in keys:
            prefix = f"{path}." if path else ""
            raise PolicyError(f"{prefix}{key}", f"unknown field (known: {', '.join(keys)})")


def _choice(value: Any, path: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise PolicyError(path, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def _int(value: Any, path: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise PolicyError(path, f"expected an integer {bound}, got {value!r}")
    return value


def _number(value: Any, path: str, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (
        high is not None and value > high
    ):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise PolicyError(path, f"expected a number {bound}, got {value!r}")
    return float(value)


def _placement(value: Any, path: str, names: tuple[str, ...]) -> PlacementSpec:
    if isinstance(value, str):
        return _choice(value, path, names)
    if isinstance(value, Mapping) and value:
        weights: dict[str, float] = {}
        for name, weight in value.items():
            _choice(name, f"{path}.{name}", names)
            weights[name] = _number(weight, f"{path}.{name}", 0.0)
        if not any(weights.values()):
            raise PolicyError(path, "at least one weight must be above 0")
        return weights
    raise PolicyError(path, f"expected a policy name ({', '.join(names)}) or a mapping of names to weights")


def _strings(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PolicyError(path, "expected a list of non-empty strings")
    return tuple(value)


def _tolerations(value: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, list):
        raise PolicyError(path, "expected a list of tolerations")
    result = []
    for i, tol in enumerate(value):
        item = _mapping(tol, f"{path}[{i}]")
        _known(item, f"{path}[{i}]", POLICY_FIELDS["defaults.tolerations[]"])
        operator = item.get("operator", "Equal")
        _choice(operator, f"{path}[{i}].operator", ("Exists", "Equal"))
        if "effect" in item:
            _choice(item["effect"], f"{path}[{i}].effect", ("NoSchedule", "PreferNoSchedule", "NoExecute"))
        result.append(dict(item))
    return tuple(result)


def _namespace_rule(data: Mapping[str, Any], path: str, names: tuple[str, ...]) -> NamespaceRule:
    _known(data, path, POLICY_FIELDS["namespaces.*"])
    max_gpus = data.get("maxGpusPerPod")
    allow = data.get("allowSharing", True)
    if not isinstance(allow, bool):
        raise PolicyError(f"{path}.allowSharing", f"expected true or false, got {allow!r}")
    return NamespaceRule(
        max_gpus_per_pod=None if max_gpus is None else _int(max_gpus, f"{path}.maxGpusPerPod", 0),
        allowed_models=_strings(data["allowedModels"], f"{path}.allowedModels") if "allowedModels" in data else (),
        allow_sharing=allow,
        placement=_placement(data["placement"], f"{path}.placement", names) if "placement" in data else None,
        backend=_choice(data["backend"], f"{path}.backend", BACKENDS) if "backend" in data else None,
        group_topology=(_choice(data["groupTopology"], f"{path}.groupTopology", GROUP_MODES)
                        if "groupTopology" in data else None),
    )


def _group_topology(data: Mapping[str, Any]) -> dict[str, Any]:
    _known(data, "groupTopology", POLICY_FIELDS["groupTopology"])
    out: dict[str, Any] = {}
    if "levels" in data:
        levels = _strings(data["levels"], "groupTopology.levels")
        if not levels or len(set(levels)) != len(levels):
            raise PolicyError("groupTopology.levels", "expected node label keys, innermost first, each once")
        out["group_levels"] = levels
    if "mode" in data:
        out["group_topology"] = _choice(data["mode"], "groupTopology.mode", GROUP_MODES)
    return out


def _dra(data: Mapping[str, Any]) -> dict[str, Any]:
    _known(data, "dra", POLICY_FIELDS["dra"])
    out: dict[str, Any] = {}
    if "deviceClasses" in data:
        out["dra_device_classes"] = _strings(data["deviceClasses"], "dra.deviceClasses")
    if "extendedResources" in data:
        names = _strings(data["extendedResources"], "dra.extendedResources")
        for i, name in enumerate(names):
            if "/" not in name:
                raise PolicyError(f"dra.extendedResources[{i}]", f"{name!r} is not an extended resource name")
            if is_gpu_resource(name):  # counted from the pod's resources already: twice would be wrong
                raise PolicyError(f"dra.extendedResources[{i}]", f"{name} is counted already; leave it out")
        out["dra_extended_resources"] = names
    return out


def _labels(value: Any, path: str) -> dict[str, str]:
    labels = _mapping(value, path)
    for key, text in labels.items():
        if not isinstance(key, str) or not key or not isinstance(text, str):
            raise PolicyError(f"{path}.{key}", f"expected a label key with a string value, got {text!r}")
    return dict(labels)


def _pool(data: Mapping[str, Any], path: str) -> ScalePool:
    _known(data, path, POLICY_FIELDS["capacity.scaleFromZero[]"])
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError(f"{path}.name", f"expected the pool's name, got {name!r}")
    taints = []
    raw_taints = data.get("taints", [])
    if not isinstance(raw_taints, list):
        raise PolicyError(f"{path}.taints", "expected a list of {key, value, effect}")
    for i, raw in enumerate(raw_taints):
        where = f"{path}.taints[{i}]"
        item = _mapping(raw, where)
        _known(item, where, POLICY_FIELDS["capacity.scaleFromZero[].taints[]"])
        key, value = item.get("key"), item.get("value", "")
        if not isinstance(key, str) or not key:
            raise PolicyError(f"{where}.key", f"expected a taint key, got {key!r}")
        if not isinstance(value, str):
            raise PolicyError(f"{where}.value", f"expected a string, got {value!r}")
        effect = _choice(item.get("effect", "NoSchedule"), f"{where}.effect",
                         ("NoSchedule", "PreferNoSchedule", "NoExecute"))
        taints.append(Taint(key, value, effect))
    gpu = _mapping(data.get("gpu"), f"{path}.gpu")
    _known(gpu, f"{path}.gpu", POLICY_FIELDS["capacity.scaleFromZero[].gpu"])
    model = gpu.get("model", "")
    if not isinstance(model, str):
        raise PolicyError(f"{path}.gpu.model", f"expected the GPU model as nodes label it, got {model!r}")
    return ScalePool(
        name=name,
        labels=_labels(data.get("labels"), f"{path}.labels"),
        taints=tuple(taints),
        gpu_model=model,
        gpu_count=_int(gpu.get("count", 1), f"{path}.gpu.count", 1, 64),
        memory_mib=_int(gpu.get("memoryMiB", 0), f"{path}.gpu.memoryMiB", 0),
        vendor=_choice(gpu.get("vendor", "nvidia"), f"{path}.gpu.vendor", tuple(COUNT_RESOURCES)),
    )


def _capacity(data: Mapping[str, Any]) -> dict[str, Any]:
    _known(data, "capacity", POLICY_FIELDS["capacity"])
    raw = data.get("scaleFromZero", [])
    if not isinstance(raw, list):
        raise PolicyError("capacity.scaleFromZero", "expected a list of node pools")
    pools = tuple(_pool(_mapping(item, f"capacity.scaleFromZero[{i}]"), f"capacity.scaleFromZero[{i}]")
                  for i, item in enumerate(raw))
    seen: set[str] = set()
    for i, pool in enumerate(pools):
        if pool.name in seen:
            raise PolicyError(f"capacity.scaleFromZero[{i}].name", f"pool {pool.name} is declared twice")
        seen.add(pool.name)
    return {"scale_from_zero": pools}


def _defaults(data: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    _known(data, "defaults", POLICY_FIELDS["defaults"])
    out: dict[str, Any] = {}
    if "placement" in data:
        out["placement"] = _placement(data["placement"], "defaults.placement", names)
    if "gpuPlacement" in data:
        out["gpu_placement"] = _choice(data["gpuPlacement"], "defaults.gpuPlacement", GPU_PLACEMENTS)
    if "topology" in data:
        topo = _choice(data["topology"], "defaults.topology", tuple(t.value for t in TopologyPreference))
        out["topology"] = TopologyPreference(topo)
    if "backend" in data:
        out["backend"] = _choice(data["backend"], "defaults.backend", BACKENDS)
    if "sliceDefaults" in data:
        out["slice_defaults"] = _choice(data["sliceDefaults"], "defaults.sliceDefaults", SLICE_DEFAULTS)
    for key, attr in (("memoryPercent", "memory_percent"), ("coresPercent", "cores_percent")):
        if data.get(key) is not None:
            out[attr] = _int(data[key], f"defaults.{key}", 1, 100)
    if "tolerations" in data:
        out["tolerations"] = _tolerations(data["tolerations"], "defaults.tolerations")
    if "preferredNodes" in data:
        out["preferred_nodes"] = _int(data["preferredNodes"], "defaults.preferredNodes", 0, 20)
    if "maxAffinityNodes" in data:
        out["max_affinity_nodes"] = _int(data["maxAffinityNodes"], "defaults.maxAffinityNodes", 1)
    return out


def _topology_loss(data: Mapping[str, Any]) -> dict[str, Any]:
    _known(data, "topologyLoss", POLICY_FIELDS["topologyLoss"])
    table = dict(DEFAULT_TOPOLOGY_LOSS)
    for key, value in data.items():
        table[TopologyClass(key)] = _number(value, f"topologyLoss.{key}", 0.0, 1.0)
    if not table[TopologyClass.NVLINK] <= table[TopologyClass.MIXED] <= table[TopologyClass.PCIE]:
        raise PolicyError("topologyLoss", "expected nvlink <= mixed <= pcie")
    return {"topology_loss": table}


def _stale(data: Mapping[str, Any]) -> dict[str, Any]:
    _known(data, "stale", POLICY_FIELDS["stale"])
    out: dict[str, Any] = {}
    if "afterSeconds" in data:
        out["stale_after_seconds"] = _number(data["afterSeconds"], "stale.afterSeconds", 1.0)
    if "graceSeconds" in data:
        out["stale_grace_seconds"] = _number(data["graceSeconds"], "stale.graceSeconds", 0.0)
    if "action" in data:
        out["on_stale"] = _choice(data["action"], "stale.action", ON_STALE)
    return out


def _reservations(data: Mapping[str, Any]) -> dict[str, Any]:
    _known(data, "reservations", POLICY_FIELDS["reservations"])
    if "ttlSeconds" in data:
        return {"reservation_ttl_seconds": _number(data["ttlSeconds"], "reservations.ttlSeconds", 1.0)}
    return {}


def _workload_mix(mix: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if mix in MIX_SOURCES or mix == []:  # an empty list: as before, learned
        out["workload_mix_source"] = mix or "learn"
        mix = []
    elif not isinstance(mix, list):
        raise PolicyError("workloadMix", "expected learn, default, or a list of {gpus, milli, weight}")
    else:
        out["workload_mix_source"] = "fixed"
    entries = []
    for i, raw in enumerate(mix):
        item = _mapping(raw, f"workloadMix[{i}]")
        _known(item, f"workloadMix[{i}]", POLICY_FIELDS["workloadMix[]"])
        entries.append(
            MixEntry(
                gpus=_int(item.get("gpus", 1), f"workloadMix[{i}].gpus", 1, 64),
                milli=_int(item.get("milli", 1000), f"workloadMix[{i}].milli", 1, 1000),
                weight=_number(item.get("weight", 1.0), f"workloadMix[{i}].weight", 0.0),
            )
        )
    if mix and not any(e.weight > 0 for e in entries):
        raise PolicyError("workloadMix", "every weight is 0; give one a weight above 0")
    out["workload_mix"] = tuple(entries)
    return out


def _isolation(data: Mapping[str, Any]) -> dict[str, Any]:
    _known(data, "isolation", POLICY_FIELDS["isolation"])
    out: dict[str, Any] = {}
    if "gpuRuntimeClasses" in data:
        out["gpu_runtime_classes"] = _strings(data["gpuRuntimeClasses"], "isolation.gpuRuntimeClasses")
    for key, attr, choices in (("unresolvedEnvFrom", "unresolved_env_from", ENV_FROM_ACTIONS),
                               ("nonGpuAccess", "non_gpu_access", ISOLATION_ACTIONS)):
        if key in data:
            out[attr] = _choice(data[key], f"isolation.{key}", choices)
    return out


def parse_policy(
    data: Any, scorers: Mapping[str, Callable[..., float]] | None = None
) -> Policy:
    """Build a Policy from the decoded YAML; raise PolicyError naming the field on any mistake."""
    scorers = dict(scorers or {})
    names = BUILTIN_PLACEMENTS + tuple(sorted(scorers))
    root = _mapping(data, "(top level)")
    _known(root, "", POLICY_FIELDS[""])
    kwargs: dict[str, Any] = {"scorers": scorers}
    kwargs.update(_defaults(_mapping(root.get("defaults"), "defaults"), names))
    if "topologyLoss" in root:
        kwargs.update(_topology_loss(_mapping(root["topologyLoss"], "topologyLoss")))
    if "whenFull" in root:
        kwargs["when_full"] = _choice(root["whenFull"], "whenFull", WHEN_FULL)
    if "managedNamespaces" in root:
        kwargs["managed_namespaces"] = _choice(root["managedNamespaces"], "managedNamespaces", MANAGED_MODES)
    if "stale" in root:
        kwargs.update(_stale(_mapping(root["stale"], "stale")))
    if "reservations" in root:
        kwargs.update(_reservations(_mapping(root["reservations"], "reservations")))
    if "workloadMix" in root:
        kwargs.update(_workload_mix(root["workloadMix"]))
    if "isolation" in root:
        kwargs.update(_isolation(_mapping(root["isolation"], "isolation")))
    if "dra" in root:
        kwargs.update(_dra(_mapping(root["dra"], "dra")))
    if "groupTopology" in root:
        kwargs.update(_group_topology(_mapping(root["groupTopology"], "groupTopology")))
    if "capacity" in root:
        kwargs.update(_capacity(_mapping(root["capacity"], "capacity")))
    if "namespaces" in root:
        spaces = _mapping(root["namespaces"], "namespaces")
        kwargs["namespaces"] = {
            str(name): _namespace_rule(_mapping(rule, f"namespaces.{name}"), f"namespaces.{name}", names)
            for name, rule in spaces.items()
        }
    return Policy(**kwargs)
