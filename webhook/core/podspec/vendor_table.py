"""The vendor table: one `Vendor` row per vendor whose devices this controller counts, and what is read
from it.

A new vendor is one more row in `TABLE`: its resource names (each dialect of them), its selection
annotations, and how its devices are handed out and limited. Everything below reads the table; no other
module of the package names a vendor. `classify_resource` and `count_name_of` are memoised by the
resource name (a cluster uses few), which keeps the webhook's fast path cheap (`fastpath.py`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class VendorResources:
    """One dialect of resource names for one vendor's devices. `<model>` stands for a model part
    (Cambricon: `mlu`, `mlu370`, ...). Memory values are multiplied by `memory_unit_mib`. `read_by`: the
    scheduler that reads this dialect's slice resources itself (its pods keep them); `advertised_slices`:
    the nodes' device plugin advertises the memory and cores resources, so every scheduler fits them and
    every pod keeps them. `vendor` is filled in by the vendor's row."""

    count: str
    memory: str | None = None
    memory_pct: str | None = None
    cores: str | None = None
    memory_unit_mib: int = 1
    read_by: str = ""
    advertised_slices: bool = False
    vendor: str = ""


@dataclass(frozen=True, slots=True)
class Vendor:
    """One vendor's row.

    * `domain`: the resource domain whose names the table does not list are still this vendor's devices.
    * `resources`: its dialects of resource names; the first one's count is the resource the mutation
      writes a count in, and the taint its device plugin puts on GPU nodes, which the mutation tolerates.
    * `selectors`: HAMi's GPU selection annotations (use-type, nouse-type, use-uuid, nouse-uuid).
    * `model_part`: what `<model>` stands for in the memory resource a user is told to write.
    * `mig_prefix`: MIG devices as the device plugin's "mixed" strategy advertises them (`<prefix><profile>`).
    * `not_devices`: names in its domain that are no device (HAMi's task priority).
    * `advertised_by_name`: a name of its domain the table does not list is a resource the device plugin
      advertises under a name of its own, placed where nodes advertise it (as MIG devices are); else such
      a name counts as whole devices.
    * `cuda_limits`: its runtime reads the CUDA limit variables (HAMi-core, MPS).
    * `topology_modelled`: the topology model and its loss figures (NVLink vs PCIe) describe its links.
    * `slices_enforced_by`: the one scheduler under which its slices are enforced (a warning otherwise).
    * `register`: the Node annotation HAMi's device plugin registers its devices in.
    * `device_model`: the model a node known only by the vendor's resources is given ("" : the vendor's
      name in capitals); `device_ids`: HAMi's id of such a node's i-th device after the node's name
      ("" : `-<vendor>-`), which the vendor's use-uuid annotation names.
    """

    name: str
    domain: str
    resources: tuple[VendorResources, ...]
    selectors: tuple[str, str, str, str]
    model_part: str = ""
    mig_prefix: str = ""
    not_devices: frozenset[str] = field(default_factory=frozenset)
    advertised_by_name: bool = False
    cuda_limits: bool = False
    topology_modelled: bool = False
    slices_enforced_by: str = ""
    register: str = ""
    device_model: str = ""
    device_ids: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "resources", tuple(replace(r, vendor=self.name) for r in self.resources))


TABLE: tuple[Vendor, ...] = (
    Vendor(
        "nvidia",
        "nvidia.com",
        (
            VendorResources("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
                            "nvidia.com/gpucores", read_by="hami-scheduler"),
            VendorResources("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-memory-percentage",
                            "volcano.sh/vgpu-cores", read_by="volcano"),
        ),
        ("nvidia.com/use-gputype", "nvidia.com/nouse-gputype", "nvidia.com/use-gpuuuid", "nvidia.com/nouse-gpuuuid"),
        # The profile as GFD names it (`1g.5gb`, `3g.20gb`, `1g.5gb.me` for NVML's `1g.5gb+me`, `1c.3g.20gb`).
        mig_prefix="nvidia.com/mig-",
        not_devices=frozenset({"nvidia.com/priority"}),
        # Time-slicing and MPS replicas `nvidia.com/gpu.shared` (renameByDefault), and any `nvidia.com/<name>`
        # a device plugin config's `rename` or `resources.gpus` gives.
        advertised_by_name=True,
        cuda_limits=True,
        topology_modelled=True,
    ),
    Vendor(
        "hygon",
        "hygon.com",
        (VendorResources("hygon.com/dcunum", "hygon.com/dcumem", None, "hygon.com/dcucores",
                         read_by="hami-scheduler"),),
        ("hygon.com/use-dcutype", "hygon.com/nouse-dcutype", "hygon.com/use-gpuuuid", "hygon.com/nouse-gpuuuid"),
        # HAMi's DCU plugin limits only the devices HAMi's scheduler assigned (`hami.io/dcu-devices-allocated`).
        slices_enforced_by="hami-scheduler",
        register="hami.io/node-dcu-register",
        device_model="DCU",
    ),
    Vendor(
        "cambricon",
        "cambricon.com",
        (VendorResources("cambricon.com/vmlu", "cambricon.com/<model>.smlu.vmemory", None,
                         "cambricon.com/<model>.smlu.vcore", memory_unit_mib=256, read_by="hami-scheduler",
                         # dynamic-smlu mode: HAMi reads their capacity from the Node to know the cards
                         advertised_slices=True),),
        ("cambricon.com/use-mlutype", "cambricon.com/nouse-mlutype", "cambricon.com/use-gpuuuid",
         "cambricon.com/nouse-gpuuuid"),
        model_part="mlu",  # the one model name HAMi manages (its chart's)
        device_model="MLU",
        device_ids="-cambricon-mlu-",
    ),
)

# Views of the table, for the readers that look one thing up.
BY_NAME: Mapping[str, Vendor] = {v.name: v for v in TABLE}
VENDORS: tuple[VendorResources, ...] = tuple(r for v in TABLE for r in v.resources)  # every dialect
COUNT_RESOURCES: Mapping[str, str] = {v.name: v.resources[0].count for v in TABLE}
SELECTORS: Mapping[str, tuple[str, str, str, str]] = {v.name: v.selectors for v in TABLE}
CUDA_ENFORCED = frozenset(v.name for v in TABLE if v.cuda_limits)
TOPOLOGY_MODELLED = frozenset(v.name for v in TABLE if v.topology_modelled)
ADVERTISED_BY_NAME = frozenset(v.name for v in TABLE if v.advertised_by_name)
VENDOR_DOMAINS: Mapping[str, str] = {v.domain: v.name for v in TABLE}
NOT_DEVICES: frozenset[str] = frozenset(name for v in TABLE for name in v.not_devices)
REGISTER_ANNOTATIONS: Mapping[str, str] = {v.name: v.register for v in TABLE if v.register}
MIG_PREFIX = BY_NAME["nvidia"].mig_prefix  # the one vendor with MIG devices (domain.vendor_quota spells it too)
_MIG_PREFIXES: Mapping[str, str] = {v.name: v.mig_prefix for v in TABLE if v.mig_prefix}
_MIG_PROFILE = re.compile(r"(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:[.+][a-z0-9]+)*")

# Schedulers that read slice resources themselves, by the domains of the names they read: their pods
# keep those resources (HAMi's scheduler reads nvidia.com/gpumem; Volcano's vGPU plugin volcano.sh/vgpu-*).
SCHEDULER_RESOURCES: Mapping[str, tuple[str, ...]] = {
    scheduler: tuple(dict.fromkeys(r.count.partition("/")[0] + "/" for r in VENDORS if r.read_by == scheduler))
    for scheduler in dict.fromkeys(r.read_by for r in VENDORS if r.read_by)
}

MAX_GPUS = 1024  # per container, any vendor; more is a typo, not a request
MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB per GPU


def _name_pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.escape(template).replace(re.escape("<model>"), "[A-Za-z0-9][-A-Za-z0-9_]*"))


def _matches(template: str | None, name: str) -> bool:
    return template is not None and (template == name or (
        "<model>" in template and _name_pattern(template).fullmatch(name) is not None))


_ADVERTISED = [r for r in VENDORS if r.advertised_slices]
_ADVERTISED_DOMAINS = tuple(r.count.partition("/")[0] + "/" for r in _ADVERTISED)
_ADVERTISED_SLICES = re.compile("|".join(
    _name_pattern(t).pattern for r in _ADVERTISED for t in (r.memory, r.cores) if t is not None) or "(?!)")


@lru_cache(maxsize=4096)
def classify_resource(name: str) -> tuple[str, str, int] | None:
    """(vendor, field, memory unit MiB) for a GPU resource name, or None. `field` is count, memory,
    memory_pct, cores, mig (MIG devices of one profile), or device (a name the table does not know, in a
    vendor's domain)."""
    for vendor, prefix in _MIG_PREFIXES.items():
        if name.startswith(prefix) and _MIG_PROFILE.fullmatch(name[len(prefix):]):
            return vendor, "mig", 1
    for row in VENDORS:
        for field_name in ("count", "memory", "memory_pct", "cores"):
            if _matches(getattr(row, field_name), name):
                return row.vendor, field_name, row.memory_unit_mib if field_name == "memory" else 1
    domain = name.partition("/")[0]
    if domain in VENDOR_DOMAINS and name not in NOT_DEVICES and "/" in name:
        return VENDOR_DOMAINS[domain], "device", 1
    return None


@lru_cache(maxsize=1024)
def count_name_of(name: str) -> str | None:
    """The device-count resource of the dialect a memory/cores resource belongs to (volcano.sh/vgpu-memory:
    volcano.sh/vgpu-number), so that a count added to a pod is one its own device plugin advertises."""
    for row in VENDORS:
        if any(_matches(template, name) for template in (row.memory, row.memory_pct, row.cores)):
            return row.count
    return None


def vendor_of_resource(name: str) -> str | None:
    """The vendor whose devices a resource name counts ("nvidia" for nvidia.com/mig-3g.20gb), or None."""
    kind = classify_resource(name)
    return kind[0] if kind else None


def is_gpu_resource(name: str) -> bool:
    return classify_resource(name) is not None


def selector_names(vendor: str) -> tuple[str, str, str, str]:
    """The vendor's own selection annotations (HAMi reads only those for its devices); the first row's for ""."""
    return SELECTORS.get(vendor, TABLE[0].selectors)


def memory_name(vendor: str) -> str:
    """The per-device memory resource a user of this vendor writes (hygon.com/dcumem, ...)."""
    row = BY_NAME.get(vendor, TABLE[0])
    memory = next((r.memory for r in row.resources if r.memory), None) or TABLE[0].resources[0].memory or ""
    return memory.replace("<model>", row.model_part)


def kept_for_scheduler(scheduler: str, name: str) -> bool:
    """Whether a slice resource stays in the pod because its scheduler reads it (or nodes advertise it)."""
    if name.startswith(_ADVERTISED_DOMAINS) and _ADVERTISED_SLICES.fullmatch(name):
        return True
    domains = SCHEDULER_RESOURCES.get(scheduler)
    return domains is not None and name.startswith(domains)


def mig_profile(name: str) -> str:
    """The profile of a MIG resource name (`nvidia.com/mig-3g.20gb`: "3g.20gb"); "" for any other name."""
    kind = classify_resource(name)
    return name[len(_MIG_PREFIXES[kind[0]]):] if kind is not None and kind[1] == "mig" else ""


def device_kind(name: str) -> str:
    """The kind of device a resource name hands out whole, placed where nodes advertise it: the MIG
    profile of `nvidia.com/mig-<profile>`, the name itself for another resource NVIDIA's device plugin
    advertises (`nvidia.com/gpu.shared`); "" for cards, slices and other names (domain.vendor_quota's
    device_resource turns a kind back into its resource)."""
    kind = classify_resource(name)
    if kind is None:
        return ""
    if kind[1] == "mig":
        return name[len(_MIG_PREFIXES[kind[0]]):]
    return name if kind[1] == "device" and kind[0] in ADVERTISED_BY_NAME else ""


def mig_memory_of_name(profile: str) -> int:
    """MiB a profile's name promises (`3g.20gb`: 20 GB as 20480 MiB), for when neither GFD's
    `nvidia.com/mig-<profile>.memory` label nor the node's inventory gives the device's own figure."""
    match = re.search(r"([0-9]+)gb", profile)
    return int(match.group(1)) * 1024 if match else 0


def enforced_backend(vendor: str, mig: str, backend: str) -> str:
    """The limit backend that applies to a pod's devices: none for MIG devices (the hardware bounds a MIG
    device's memory and SMs) and for vendors whose runtime does not read CUDA_* variables (Hygon's DCU and
    Cambricon's MLU runtimes read their device plugin's own configuration, HAMi's allocation annotations)."""
    return backend if vendor in CUDA_ENFORCED and not mig else "none"


def unenforced_slice(vendor: str, shared: bool, scheduler: str) -> str | None:
    """The warning for a slice nothing will enforce: the vendor's device plugin limits only the devices its
    one scheduler assigned (`slices_enforced_by`), and no CUDA variable reaches its devices."""
    row = BY_NAME.get(vendor)
    if row is None or not row.slices_enforced_by or not shared or scheduler == row.slices_enforced_by:
        return None
    names = row.resources[0]
    cores = (names.cores or "").partition("/")[2]
    return (f"{names.memory} and {cores} are enforced only with schedulerName: {row.slices_enforced_by}; "
            "recorded and counted here")
