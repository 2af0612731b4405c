"""The domain of the allocation core: frozen values, no behaviour beyond small derived properties.

Every layer (webhook, `check`, the simulator, the watch cache) builds these and hands them to the
core; nothing here knows about Kubernetes objects, HTTP or files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, NamedTuple

from .names import ENABLED_LABEL
from .shapes import Observed
from .vendor_quota import CAMBRICON, HYGON, device_quota_key

# ---------------------------------------------------------------------------------------------
# Cluster: nodes, their GPUs and links, what is in use
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical device on a node."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    numa: int = 0
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class ScalePool:
    """A node pool that can scale from zero: the policy's `capacity.scaleFromZero` (kind ""), or read from
    the cluster (a Karpenter NodePool, a Cluster API node group: cluster/nodepools.py). A pod no existing
    node can host waits for one of its nodes instead of being refused (core/placement/capacity.py)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu_model: str = ""
    gpu_count: int = 1
    memory_mib: int = 0  # per card; 0: unknown
    vendor: str = "nvidia"
    kind: str = ""  # "" (the policy's), "NodePool", "MachineDeployment", "MachineSet", "MachinePool"
    # A NodePool's requirements (key, operator, values), matched as Karpenter does; its GPUs come from them.
    requirements: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    cpu_milli: int = 0  # a node's CPU and memory when stated; 0: unknown
    host_memory_mib: int = 0
    # A NodePool's spec.limits (GPUs, CPU millicores, memory MiB by resource) and what its nodes hold now.
    limits: Mapping[str, int] = field(default_factory=dict)
    used: Mapping[str, int] = field(default_factory=dict)
    full: str = ""  # why it makes no node now ("": it can)

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}" if self.kind else self.name


@dataclass(frozen=True)
class Node:
    """A schedulable node as the core sees it.

    `nvlink[i][j]` is the number of NVLink links between GPUs i and j (0 for none);
    `pcie[i][j]` is the PCIe path level as `nvidia-smi topo -m` names it (X, PIX, PXB, PHB, NODE, SYS).
    Both are square with one row per entry of `gpus`, in the same order.
    """

    name: str
    gpus: tuple[Gpu, ...] = ()
    nvlink: tuple[tuple[int, ...], ...] = ()
    pcie: tuple[tuple[str, ...], ...] = ()
    vendor: str = "nvidia"
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    # Where the GPU list came from: "inventory" (GPUInventory object), "annotation", "labels", "none".
    inventory_source: str = "none"
    # The node's NVIDIA container toolkit, as its agent reported it: True when it honours
    # NVIDIA_VISIBLE_DEVICES from unprivileged containers (the toolkit's default), False when it
    # ignores it, None when unknown (no agent, or no config file on the node).
    toolkit_envvar: bool | None = None
    # MIG devices the node offers, by profile ("3g.20gb"): (count, memory MiB of one), from the node's
    # allocatable `nvidia.com/mig-<profile>`, GFD's `nvidia.com/mig-<profile>.*` labels or its inventory;
    # and the other NVIDIA resources it advertises under names of their own, by name
    # ("nvidia.com/gpu.shared"), from its allocatable (placement/mig.py).
    mig: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # The `nvidia.com/gpu` units its device plugin advertises (allocatable): the scheduler admits pods
    # until their requests add up to this, whatever their share of a card. One unit per card without
    # HAMi's split or time-slicing replicas; None: unknown (no limit beyond the cards).
    gpu_units: int | None = None

    @property
    def clique(self) -> str | None:
        """Multi-node NVLink domain (GPU Feature Discovery's `nvidia.com/gpu.clique`)."""
        return self.labels.get("nvidia.com/gpu.clique")

    @property
    def gpu_model(self) -> str:
        """The model of the node's GPUs ("" when it has none); nodes are homogeneous in practice."""
        return self.gpus[0].model if self.gpus else ""


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """What is already committed on one GPU."""

    memory_mib: int = 0
    cores: int = 0  # percent of SMs, summed over the tasks sharing the card
    tasks: int = 0
    exclusive: bool = False  # a task holds the whole card


@dataclass(frozen=True)
class NodeUsage:
    """What is already committed on one node. `gpus` is parallel to `Node.gpus`."""

    gpus: tuple[GpuUsage, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_tasks: int = 0  # running GPU pods on the node (the fewest-tasks policy reads this)

    def __hash__(self) -> int:
        """Cached: usages key the placement and fragmentation memos, hashed many times each."""
        found: int | None = self.__dict__.get("_hash")
        if found is None:
            found = hash((self.gpus, self.cpu_milli, self.memory_mib, self.gpu_tasks))
            object.__setattr__(self, "_hash", found)
        return found


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """One ResourceQuota's GPU keys (None: that key is not set)."""

    name: str
    gpus: int | None = None  # requests.nvidia.com/gpu
    memory_mib: int | None = None  # limits.nvidia.com/gpumem, memory x GPUs
    cores: int | None = None  # limits.nvidia.com/gpucores, percent x GPUs
    # MIG profiles' and other vendors' keys (core/vendor_quota.py), normalised, with their limits.
    keys: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU consumption of a namespace, in the units of the quota keys."""

    gpus: int = 0
    memory_mib: int = 0
    cores: int = 0
    # MIG profiles' and other vendors' quota keys (core/vendor_quota.py): (normalised key, amount), sorted.
    keys: tuple[tuple[str, int], ...] = ()

    def __add__(self, other: Usage) -> Usage:
        keys = _merged(self.keys, other.keys, 1) if self.keys or other.keys else ()
        return Usage(self.gpus + other.gpus, self.memory_mib + other.memory_mib, self.cores + other.cores, keys)

    def __sub__(self, other: Usage) -> Usage:
        keys = _merged(self.keys, other.keys, -1) if self.keys or other.keys else ()
        return Usage(self.gpus - other.gpus, self.memory_mib - other.memory_mib, self.cores - other.cores, keys)

    def key(self, name: str) -> int:
        return next((amount for key, amount in self.keys if key == name), 0)


def _merged(a: tuple[tuple[str, int], ...], b: tuple[tuple[str, int], ...], sign: int) -> tuple[tuple[str, int], ...]:
    total = dict(a)
    for key, amount in b:
        total[key] = total.get(key, 0) + sign * amount
    return tuple(sorted((k, v) for k, v in total.items() if v))


@dataclass(frozen=True)
class Namespace:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        return self.labels.get(ENABLED_LABEL) == "true"


@dataclass(frozen=True, slots=True)
class DeviceAsk:
    """One way to satisfy a DRA device request (`exactly`, or one `firstAvailable` alternative)."""

    device_class: str
    count: int = 1  # allocationMode ExactCount's count
    all_devices: bool = False  # allocationMode All: every matching device, a number unknown here
    selectors: tuple[str, ...] = ()  # CEL expressions
    admin_access: bool = False


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim (or a ResourceClaimTemplate's claim spec), reduced to its device requests.

    `requests` has one entry per request, each the tuple of its alternatives (one for `exactly`).
    `reserved_for` names the consumers holding the claim now (status.reservedFor, "pods/<name>").
    """

    namespace: str
    name: str
    requests: tuple[tuple[str, tuple[DeviceAsk, ...]], ...] = ()
    reserved_for: tuple[str, ...] = ()


class EnvReader(NamedTuple):
    """Containers of live GPU pods that read one ConfigMap through envFrom with one prefix."""

    prefix: str
    where: str  # "container 'main'"
    pod: str  # the first of those pods by name, for messages
    pods: int  # how many pods


class Derived:
    """The one structure placement derives from a snapshot: its node index, with the `nodes` and `usage`
    mappings it was built from. A snapshot made by `dataclasses.replace` shares this holder; the mappings
    kept here tell placement whether the index is still the snapshot's own (`placement.state.index_of`)."""

    __slots__ = ("index", "nodes", "usage")

    def __init__(self) -> None:
        self.index: object = None
        self.nodes: object = None
        self.usage: object = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the core knows about the cluster at one moment. Read-only by convention.

    `usage` has an entry for every node in `nodes` (an all-zero NodeUsage when nothing runs there).
    `namespace_usage` is what running pods and reservations already count against quotas.
    """

    nodes: Mapping[str, Node] = field(default_factory=dict)
    usage: Mapping[str, NodeUsage] = field(default_factory=dict)
    namespaces: Mapping[str, Namespace] = field(default_factory=dict)
    quotas: Mapping[str, tuple[QuotaLimits, ...]] = field(default_factory=dict)
    namespace_usage: Mapping[str, Usage] = field(default_factory=dict)
    # What placement derives from `nodes` and `usage` (its node index), kept with the snapshot; never
    # part of equality. Only placement reads or fills it (`placement.state`).
    derived: Derived = field(default_factory=lambda: Derived(), compare=False, repr=False)
    # DRA ResourceClaims and ResourceClaimTemplates, by "namespace/name" (see core/dra.py).
    claims: Mapping[str, Claim] = field(default_factory=dict)
    claim_templates: Mapping[str, Claim] = field(default_factory=dict)
    # Which of those live pods hold: namespace -> ("ResourceClaim" | "ResourceClaimTemplate", "ns/name")
    # -> how many pods hold it (core/dra.py `claim_users`). A claim written again while pods hold it
    # changes what they count (core/dra_objects.py).
    claim_users: Mapping[str, Mapping[tuple[str, str], int]] = field(default_factory=dict)
    # ConfigMaps by namespace and name, each reduced to the keys of its data that can name an isolation
    # variable through envFrom (core/admission/envfrom.py, `env_from_keys`); one absent here is not known.
    config_maps: Mapping[str, Mapping[str, frozenset[str]]] = field(default_factory=dict)
    # Who reads each ConfigMap through envFrom: namespace -> ConfigMap name -> the distinct (prefix,
    # container) of live GPU pods (core/admission/configmap_writes.py `config_map_write`: the kubelet
    # re-reads a ConfigMap at every container start, so an edit reaches pods admitted before it).
    env_readers: Mapping[str, Mapping[str, tuple[EnvReader, ...]]] = field(default_factory=dict)
    # Multi-pod groups' chosen domains (core/groups.py `GroupRecord`), by `GroupRecord.key`.
    groups: Mapping[str, Any] = field(default_factory=dict)
    # Multi-pod groups' sizes as their controllers' objects state them (a PyTorchJob's replicas, a
    # PodGroup's minMember: core/placement/groups.py `sizes_of`), by the `GroupRef.key` of their pods.
    group_sizes: Mapping[str, int] = field(default_factory=dict)
    # Node pools read from the cluster that can scale from zero (the policy's own come first).
    scale_pools: tuple[ScalePool, ...] = ()
    # The GPU pods held (running, pending, admitted) by request shape: what the learned workload mix is
    # derived from (`shapes.Observed`); None: nothing observed. Derived from the pods and the
    # reservations, like `derived`: not part of equality (`state.with_allocation` leaves it as it is).
    observed: Observed | None = field(default=None, compare=False)


# ---------------------------------------------------------------------------------------------
# Placement and decisions
# ---------------------------------------------------------------------------------------------


class TopologyClass(StrEnum):
    SINGLE = "single"  # one GPU: no inter-GPU traffic
    NVLINK = "nvlink"  # every pair linked by NVLink
    MIXED = "mixed"  # some pairs NVLink, some PCIe
    PCIE = "pcie"  # no NVLink between any pair


# Expected communication loss of a multi-GPU set per topology class (policy `topologyLoss` overrides).
DEFAULT_TOPOLOGY_LOSS: Mapping[TopologyClass, float] = {
    TopologyClass.SINGLE: 0.0,
    TopologyClass.NVLINK: 0.03,
    TopologyClass.MIXED: 0.20,
    TopologyClass.PCIE: 0.375,
}


class Option(NamedTuple):
    """One way to host the pod now: a node, its GPUs, and how good that is. A named tuple: a placement
    builds several per admission, and a tuple costs a third of a frozen dataclass to make."""

    node: str
    gpus: tuple[int, ...]  # GPU indices on the node
    memory_mib: int  # per GPU, resolved against the card
    cores: int  # per GPU, percent
    topology: TopologyClass
    loss: float  # expected communication loss, 0..1
    score: float  # higher is better, comparable only within one placement call


@dataclass(frozen=True)
class Placement:
    """The answer of `placement.place()`.

    `eligible`: nodes that could host the pod on an empty cluster (model, capacity, topology) and that
    the pod's own constraints let it reach (nodeSelector, required node affinity, taints it does not
    tolerate, cordons). `options`: nodes that can host it now, best first, at most `limit` of them.
    `rejected` counts why other nodes fell out, by reason ("node-selector", "node-affinity", "taint",
    "model", "gpu-count", "memory", "uuid", "topology", "vendor", "cpu", "host-memory", ...).
    """

    eligible: tuple[str, ...]
    options: tuple[Option, ...]
    rejected: Mapping[str, int] = field(default_factory=dict)

    @property
    def best(self) -> Option | None:
        return self.options[0] if self.options else None


@dataclass(frozen=True)
class Allocation:
    """What the decision annotation records (`gpu-admission.io/allocation`)."""

    node: str | None  # chosen node now (None when the cluster is full right now)
    gpus: tuple[int, ...]
    gpu_count: int
    memory_mib: int  # per GPU
    cores: int  # per GPU, percent
    vendor: str
    model: str
    topology: TopologyClass
    loss: float
    policy: str
    uuids: tuple[str, ...] = ()
    version: int = 1
    # Every GPU container's own slice, (name, init, GPUs, memory per GPU, cores per GPU), when some
    # container's differs from the pod's (memory_mib, cores); empty when all have it (the usual pod).
    containers: tuple[tuple[str, bool, int, int, int], ...] = ()
    # MIG profile or advertised resource: `gpu_count` devices of it, each `memory_mib`; no card is charged
    mig: str = ""
    # Host resources the pod requests (CPU millicores, memory MiB), counted on its node like its GPUs.
    cpu_milli: int = 0
    host_memory_mib: int = 0
    # The pod's group (core/groups.py, "namespace/name") and the domain it was placed in ("label=value").
    group: str = ""
    domain: str = ""
    # What a pod admitted to wait for a node waits for: a pool (ScalePool.ref) or a ProvisioningRequest.
    awaiting_pool: str = ""
    awaiting_request: str = ""

    def slice_of(self, container: str) -> tuple[int, int]:
        """(memory MiB, cores %) per GPU of one container."""
        for name, _, _, memory, cores in self.containers:
            if name == container:
                return memory, cores
        return self.memory_mib, self.cores

    def usage(self) -> Usage:
        """What this allocation counts against the namespace's quotas: count x slice, per container when
        the containers' slices differ (init containers as Kubernetes counts them: the largest one, or
        the app containers together, whichever is more). MIG devices are no whole `nvidia.com/gpu` (the
        API server charges `requests.nvidia.com/mig-<profile>` itself, and so does this), nor Hygon's or
        Cambricon's devices: they count under their own keys (core/vendor_quota.py)."""
        if self.mig or self.vendor not in ("nvidia", ""):
            whole = Usage(self.gpu_count, self.memory_mib * self.gpu_count, self.cores * self.gpu_count)
            base = replace(self, mig="", vendor="nvidia").usage() if self.containers else whole
            return usage_of(self.vendor, self.mig, base.gpus, base.memory_mib, base.cores)
        if not self.containers:
            return Usage(self.gpu_count, self.memory_mib * self.gpu_count, self.cores * self.gpu_count)
        app = [(n * m, n * c) for _, init, n, m, c in self.containers if not init]
        init = [(n * m, n * c) for _, init, n, m, c in self.containers if init]
        memory = max([sum(m for m, _ in app), *(m for m, _ in init)])
        cores = max([sum(c for _, c in app), *(c for _, c in init)])
        return Usage(self.gpu_count, memory, cores)


def usage_of(vendor: str, mig: str, gpus: int, memory_mib: int, cores: int) -> Usage:
    """What `gpus` devices holding `memory_mib` and `cores` in all count against quotas."""
    if mig:  # MIG devices, or another resource a device plugin advertises: its own key
        return Usage(keys=((device_quota_key(mig), gpus),))
    if vendor == "hygon":
        return Usage(keys=tuple(zip(HYGON, (gpus, memory_mib, cores), strict=True)))
    if vendor == "cambricon":
        return Usage(keys=tuple(zip(CAMBRICON, (gpus, memory_mib, cores), strict=True)))
    return Usage(gpus, memory_mib, cores)
