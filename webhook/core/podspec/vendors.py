"""Vendor resource names, dialect annotations and the GPU-pod test, as data.

A new vendor or dialect is one more row in a table here, never a new branch in the parser. Kept apart
from `resources` so that the webhook's fast path (`is_gpu_pod`) imports only what it needs.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, TypeGuard

from webhook.core.domain.model import GpuRequest
from webhook.core.domain.names import ALLOCATION, GPU_PLACEMENTS

from .limits import GPU_POD_ONLY_ENV, NO_DEVICES, is_isolation_env, is_pin
from .quantity import QuantityError, parse_quantity


@dataclass(frozen=True, slots=True)
class VendorResources:
    """One dialect of resource names for one vendor's devices. `<model>` stands for a model part
    (Cambricon: `mlu`, `mlu370`, ...). Memory values are multiplied by `memory_unit_mib`."""

    vendor: str
    count: str
    memory: str | None = None
    memory_pct: str | None = None
    cores: str | None = None
    memory_unit_mib: int = 1


VENDORS: tuple[VendorResources, ...] = (
    VendorResources(
        "nvidia", "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"
    ),
    VendorResources(
        "nvidia",
        "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-memory-percentage",
        "volcano.sh/vgpu-cores",
    ),
    VendorResources(
        "cambricon",
        "cambricon.com/vmlu",
        "cambricon.com/<model>.smlu.vmemory",
        None,
        "cambricon.com/<model>.smlu.vcore",
        memory_unit_mib=256,
    ),
    VendorResources("hygon", "hygon.com/dcunum", "hygon.com/dcumem", None, "hygon.com/dcucores"),
)
# Each vendor's device count resource (its first dialect's): the resource the mutation writes a count in,
# and the taint its device plugin puts on GPU nodes, which the mutation tolerates.
COUNT_RESOURCES: Mapping[str, str] = {v.vendor: v.count for v in reversed(VENDORS)}

# NVIDIA MIG devices as the device plugin's "mixed" strategy advertises them: `nvidia.com/mig-<profile>`,
# the profile as GFD names it (`1g.5gb`, `3g.20gb`, `1g.5gb.me` for NVML's `1g.5gb+me`, `1c.3g.20gb`).
MIG_PREFIX = "nvidia.com/mig-"
_MIG_PROFILE = re.compile(r"(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:[.+][a-z0-9]+)*")
# Vendors whose runtime reads the CUDA limit variables (HAMi-core, MPS). Hygon's DCU and Cambricon's MLU
# runtimes read their device plugin's own configuration (HAMi's allocation annotations), never CUDA_*.
CUDA_ENFORCED = frozenset({"nvidia"})
# Vendors whose links the topology model and its loss figures (NVLink vs PCIe, measured on NVIDIA GPUs)
# describe; other vendors' multi-device pods get no loss figure and no link warning.
TOPOLOGY_MODELLED = frozenset({"nvidia"})

# Resource domains whose unknown names (nvidia.com/gpu.shared) are devices.
VENDOR_DOMAINS: Mapping[str, str] = {
    "nvidia.com": "nvidia",
    "cambricon.com": "cambricon",
    "hygon.com": "hygon",
}
# Vendors whose unknown names are resources their device plugin advertises under a name of its own, each
# device placed where nodes advertise that name, as MIG devices are: NVIDIA's plugin names time-slicing
# and MPS replicas `nvidia.com/gpu.shared` (renameByDefault), and any `nvidia.com/<name>` a config's
# `rename` or `resources.gpus` gives. Other vendors' unknown names count as whole devices.
ADVERTISED_BY_NAME = frozenset({"nvidia"})
NOT_DEVICES: frozenset[str] = frozenset({"nvidia.com/priority"})  # HAMi task priority, not a device

# Per-vendor GPU selection annotations (HAMi): (use-type, nouse-type, use-uuid, nouse-uuid).
SELECTORS: Mapping[str, tuple[str, str, str, str]] = {
    "nvidia": (
        "nvidia.com/use-gputype",
        "nvidia.com/nouse-gputype",
        "nvidia.com/use-gpuuuid",
        "nvidia.com/nouse-gpuuuid",
    ),
    "hygon": (
        "hygon.com/use-dcutype",
        "hygon.com/nouse-dcutype",
        "hygon.com/use-gpuuuid",
        "hygon.com/nouse-gpuuuid",
    ),
    "cambricon": (
        "cambricon.com/use-mlutype",
        "cambricon.com/nouse-mlutype",
        "cambricon.com/use-gpuuuid",
        "cambricon.com/nouse-gpuuuid",
    ),
}


def selector_names(vendor: str) -> tuple[str, str, str, str]:
    """The vendor's own selection annotations (HAMi reads only those for its devices); NVIDIA's for ""."""
    return SELECTORS.get(vendor, SELECTORS["nvidia"])


def memory_name(vendor: str) -> str:
    """The per-device memory resource a user of this vendor writes (hygon.com/dcumem, ...)."""
    row = next((r for r in VENDORS if r.vendor == vendor and r.memory), VENDORS[0])
    return (row.memory or "nvidia.com/gpumem").replace("<model>", "mlu")


KAI_FRACTION = "gpu-fraction"
KAI_FRACTION_DEVICES = "gpu-fraction-num-devices"
KAI_MEMORY = "gpu-memory"
KAI_FRACTION_CONTAINER = "gpu-fraction-container-name"  # the container (init first, then app) the share is for
HAMI_NODE_POLICY = "hami.io/node-scheduler-policy"
HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
HAMI_NUMA_BIND = "nvidia.com/numa-bind"
# Device operating mode a pod asks for (HAMi and Volcano read it as a substring test against each device's mode).
VGPU_MODES: tuple[str, ...] = ("nvidia.com/vgpu-mode", "volcano.sh/vgpu-mode")
# Annotations that make a pod a GPU pod on their own (a request, or our own decision record).
GPU_REQUEST_ANNOTATIONS: frozenset[str] = frozenset({KAI_FRACTION, KAI_MEMORY, ALLOCATION})
HAMI_POLICIES: frozenset[str] = frozenset(GPU_PLACEMENTS)
# hami.io/gpu-scheduler-policy: a comma list of sort keys (binpack, spread, numa) and filters (topology-aware,
# mutex), as HAMi's pkg/scheduler/policy and util.PolicyContains read it.
HAMI_GPU_POLICIES: frozenset[str] = frozenset({"binpack", "spread", "numa", "topology-aware", "mutex"})

MAX_GPUS = 1024  # per container; more is a typo, not a request
MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB per GPU

# Variables the mutating webhook writes (hami-core and MPS backends).
_LIMIT_ENV = re.compile(
    r"CUDA_DEVICE_MEMORY_LIMIT_[0-9]+|CUDA_DEVICE_SM_LIMIT(_[0-9]+)?|"
    r"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE|CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)


def _name_pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.escape(template).replace(re.escape("<model>"), "[A-Za-z0-9][-A-Za-z0-9_]*"))


@lru_cache(maxsize=4096)
def classify_resource(name: str) -> tuple[str, str, int] | None:
    """(vendor, field, memory unit MiB) for a GPU resource name, or None. `field` is count, memory,
    memory_pct, cores, mig (MIG devices of one profile), or device (a name the table does not know, in a
    vendor's domain)."""
    if name.startswith(MIG_PREFIX) and _MIG_PROFILE.fullmatch(name[len(MIG_PREFIX):]):
        return "nvidia", "mig", 1
    for row in VENDORS:
        for field_name in ("count", "memory", "memory_pct", "cores"):
            template: str | None = getattr(row, field_name)
            if template is None:
                continue
            if template == name or ("<model>" in template and _name_pattern(template).fullmatch(name)):
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
        for template in (row.memory, row.memory_pct, row.cores):
            if template is not None and (template == name or (
                    "<model>" in template and _name_pattern(template).fullmatch(name))):
                return row.count
    return None


# Schedulers that read slice resources themselves, by the domains of the names they read: their pods
# keep those resources (HAMi's scheduler reads nvidia.com/gpumem; Volcano's vGPU plugin volcano.sh/vgpu-*).
SCHEDULER_RESOURCES: Mapping[str, tuple[str, ...]] = {
    "hami-scheduler": ("nvidia.com/", "cambricon.com/", "hygon.com/"),
    "volcano": ("volcano.sh/",),
}


# Slice resources a node's device plugin advertises itself, so every scheduler (the default one too) fits
# them and the pod keeps them: Cambricon's plugin in dynamic-smlu mode advertises `<model>.smlu.vmemory`
# and `.smlu.vcore` (HAMi reads their capacity from the Node to know the cards).
_ADVERTISED_SLICES = re.compile(r"cambricon\.com/[A-Za-z0-9][-A-Za-z0-9_]*\.smlu\.(?:vmemory|vcore)")


def kept_for_scheduler(scheduler: str, name: str) -> bool:
    """Whether a slice resource stays in the pod because its scheduler reads it (or nodes advertise it)."""
    if name.startswith("cambricon.com/") and _ADVERTISED_SLICES.fullmatch(name):
        return True
    domains = SCHEDULER_RESOURCES.get(scheduler)
    return domains is not None and name.startswith(domains)


def mig_profile(name: str) -> str:
    """The profile of a MIG resource name (`nvidia.com/mig-3g.20gb`: "3g.20gb"); "" for any other name."""
    kind = classify_resource(name)
    return name[len(MIG_PREFIX):] if kind is not None and kind[1] == "mig" else ""


def device_kind(name: str) -> str:
    """The kind of device a resource name hands out whole, placed where nodes advertise it: the MIG
    profile of `nvidia.com/mig-<profile>`, the name itself for another resource NVIDIA's device plugin
    advertises (`nvidia.com/gpu.shared`); "" for cards, slices and other names (domain.vendor_quota's
    device_resource turns a kind back into its resource)."""
    kind = classify_resource(name)
    if kind is None:
        return ""
    if kind[1] == "mig":
        return name[len(MIG_PREFIX):]
    return name if kind[1] == "device" and kind[0] in ADVERTISED_BY_NAME else ""


def mig_memory_of_name(profile: str) -> int:
    """MiB a profile's name promises (`3g.20gb`: 20 GB as 20480 MiB), for when neither GFD's
    `nvidia.com/mig-<profile>.memory` label nor the node's inventory gives the device's own figure."""
    match = re.search(r"([0-9]+)gb", profile)
    return int(match.group(1)) * 1024 if match else 0


def enforced_backend(vendor: str, mig: str, backend: str) -> str:
    """The limit backend that applies to a pod's devices: none for MIG devices (the hardware bounds a MIG
    device's memory and SMs) and for vendors whose runtime does not read CUDA_* variables."""
    return backend if vendor in CUDA_ENFORCED and not mig else "none"


def unenforced_slice(vendor: str, shared: bool, scheduler: str) -> str | None:
    """The warning for a DCU slice nothing will enforce: HAMi's DCU plugin limits only the devices HAMi's
    scheduler assigned (`hami.io/dcu-devices-allocated`), and no CUDA variable reaches a DCU."""
    if vendor == "hygon" and shared and scheduler != "hami-scheduler":
        return ("hygon.com/dcumem and dcucores are enforced only with schedulerName: hami-scheduler; "
                "recorded and counted here")
    return None


def vendor_of_resource(name: str) -> str | None:
    """The vendor whose devices a resource name counts ("nvidia" for nvidia.com/mig-3g.20gb), or None."""
    kind = classify_resource(name)
    return kind[0] if kind else None


def is_gpu_resource(name: str) -> bool:
    return classify_resource(name) is not None


_ACCELERATOR_WORDS = ("gpu", "mlu", "dcu", "npu", "tpu", "xpu", "gcu", "hpu", "fpga", "ascend", "neuron", "gaudi",
                      "accelerator")
# Domains whose every resource is an accelerator, though its name part says so in no word above: Intel's
# GPU plugin (`gpu.intel.com/i915`, `xe`, and GPU Aware Scheduling's `millicores`, `memory.max`), Habana's
# Gaudi plugin (`habana.ai/gaudi`, `goya`), Xilinx's FPGA plugin (`xilinx.com/fpga-<shell>`). A domain
# label that is an accelerator word counts too (`fpga.intel.com/af-<id>`, `npu.intel.com/accel`).
_ACCELERATOR_DOMAINS = frozenset({"habana.ai", "xilinx.com"})


@lru_cache(maxsize=1024)
def looks_like_gpu(name: str) -> bool:
    """An extended resource that names an accelerator this controller does not count (amd.com/gpu,
    gpu.intel.com/i915, habana.ai/gaudi, huawei.com/Ascend910, aws.amazon.com/neuroncore, google.com/tpu):
    by its domain, or by a word of the table above in its name part."""
    domain, slash, part = name.lower().rpartition("/")
    if not slash:
        return False
    if domain in _ACCELERATOR_DOMAINS or any(label in _ACCELERATOR_WORDS for label in domain.split(".")):
        return True
    return any(word in part for word in _ACCELERATOR_WORDS)


def foreign_accelerator_message(where: str, name: str) -> str:
    return f"{where}: {name} is not counted or limited by this controller; left alone"


def is_limit_env(name: str) -> bool:
    """A variable the mutating webhook writes to enforce limits."""
    return _LIMIT_ENV.fullmatch(name) is not None


def is_bypass_env(name: str) -> bool:
    """A variable that widens or unlimits device access when a container sets it itself (the table in
    `limits`), in any pod; LD_PRELOAD only matters in a GPU pod."""
    return is_isolation_env(name) and name not in GPU_POD_ONLY_ENV


def is_bypass_entry(entry: object) -> bool:
    """An `env` entry that sets a bypass variable; `NVIDIA_VISIBLE_DEVICES=void` (no GPU at all, what
    the webhook itself writes into containers that must see none) is not one."""
    name = mapping_of(entry).get("name")
    if not isinstance(name, str) or not is_bypass_env(name) or is_pin(name, mapping_of(entry)):
        return False  # a pin: a switch set to its safe value over an unread envFrom source (limits.py)
    return not (name == "NVIDIA_VISIBLE_DEVICES" and mapping_of(entry).get("value") == NO_DEVICES)


def limit_env_of(container: Mapping[str, Any]) -> dict[str, str]:
    """The enforcement variables a container carries with a literal value (what our patch writes)."""
    found: dict[str, str] = {}
    for entry in list_of(container.get("env")):
        if is_mapping(entry):
            name, value = entry.get("name"), entry.get("value")
            if isinstance(name, str) and isinstance(value, str) and is_limit_env(name):
                found[name] = value
    return found


# Host paths that hold GPU device nodes, the driver or the limit layer's files. A name ending in "*"
# matches every name that starts with it in that directory (/dev/nvidia0, /dev/nvidia-caps, ...).
GPU_HOST_PATHS: tuple[str, ...] = (
    "/dev/nvidia*",  # NVIDIA device nodes: nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps, nvidia-nvswitch..
    "/dev/char",  # symlinks to every character device by major:minor, the GPUs' included
    "/dev/dri",  # DRM nodes: nvidia-drm's, and Hygon DCUs (ROCm) with /dev/kfd
    "/dev/kfd",
    "/dev/mkfd",
    "/dev/cambricon*",  # Cambricon MLU nodes: cambricon_dev0.., cambricon_ctl, cambricon-caps
    "/run/nvidia*",  # GPU operator's driver root (/run/nvidia/driver), persistenced, fabric manager
    "/var/run/nvidia*",
    "/usr/local/vgpu",  # HAMi-core: libvgpu.so, ld.so.preload, the per-container accounting files
    "/tmp/vgpulock",  # HAMi-core's lock directory
)


def normal_host_path(path: str) -> str:
    """The path the kubelet mounts: `//dev`, `/dev/../dev/` and `/dev/.` are all `/dev`. posixpath keeps
    a leading `//` (POSIX leaves it implementation-defined; Linux treats it as `/`), so collapse it."""
    return posixpath.normpath("/" + path.lstrip("/"))


def _exposes(normal: str, guarded: str) -> bool:
    if guarded.endswith("*"):
        base = guarded[:-1]
        parent = base.rpartition("/")[0] or "/"
        if normal.startswith(base):
            return True
        return normal == parent or parent.startswith(normal.rstrip("/") + "/")
    return normal == guarded or normal.startswith(guarded + "/") or guarded.startswith(normal.rstrip("/") + "/")


def is_device_hostpath(path: object) -> bool:
    """A hostPath that is, holds, or lies inside a path of GPU_HOST_PATHS (so `/`, `/dev`, `/run` too),
    compared after normalising. Ordinary data directories (/data, /mnt/datasets, /var/log) are not."""
    return isinstance(path, str) and bool(path) and _exposes_gpu(path)


@lru_cache(maxsize=1024)
def _exposes_gpu(path: str) -> bool:
    normal = normal_host_path(path)
    return any(_exposes(normal, guarded) for guarded in GPU_HOST_PATHS)


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """isinstance(value, Mapping), answering plain dicts and None (what decoded JSON holds) first:
    the ABC check costs ten times more, and pod parsing makes dozens of them."""
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def mapping_of(value: object) -> Mapping[str, Any]:
    if type(value) is dict or (value is not None and isinstance(value, Mapping)):  # as is_mapping, inlined
        return value
    return {}


def list_of(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def containers_of(spec: Mapping[str, Any]) -> list[tuple[bool, int, Mapping[str, Any]]]:
    out: list[tuple[bool, int, Mapping[str, Any]]] = []
    for init, key in ((False, "containers"), (True, "initContainers")):
        for index, container in enumerate(list_of(spec.get(key))):
            out.append((init, index, mapping_of(container)))
    return out


def is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    """Cheap test for the webhook's fast path: a GPU resource or a GPU annotation, nothing more."""
    annotations = mapping_of(mapping_of(pod.get("metadata")).get("annotations"))
    if annotations and not GPU_REQUEST_ANNOTATIONS.isdisjoint(annotations):
        return True
    spec = mapping_of(pod.get("spec"))
    for _, _, container in containers_of(spec):
        resources = mapping_of(container.get("resources"))
        for key in ("limits", "requests"):
            for resource in mapping_of(resources.get(key)):
                if isinstance(resource, str) and is_gpu_resource(resource):
                    return True
        for entry in list_of(container.get("env")):
            if is_bypass_entry(entry):
                return True
    return any(
        is_device_hostpath(mapping_of(mapping_of(v).get("hostPath")).get("path")) for v in list_of(spec.get("volumes"))
    )


def _accelerator_names(pod: Mapping[str, Any]) -> Iterator[str]:
    for _, _, container in containers_of(mapping_of(pod.get("spec"))):
        resources = mapping_of(container.get("resources"))
        for key in ("limits", "requests"):
            for resource in mapping_of(resources.get(key)):
                if (isinstance(resource, str) and resource not in ("cpu", "memory") and looks_like_gpu(resource)
                        and classify_resource(resource) is None):
                    yield resource


def foreign_accelerators(pod: Mapping[str, Any]) -> list[str]:
    """The accelerators outside the vendor table a pod asks for (gpu.intel.com/i915, habana.ai/gaudi,
    amd.com/gpu), sorted: not GPUs of this controller, but the webhook answers such a pod (with a
    warning that nothing counts or limits them) instead of waving it through silently."""
    return sorted(set(_accelerator_names(pod)))


def has_foreign_accelerator(pod: Mapping[str, Any]) -> bool:
    return next(_accelerator_names(pod), None) is not None


# Toleration keys every pod carries (DefaultTolerationSeconds, DaemonSets) or that only concern control
# planes; any other key may be a GPU node's taint, so such a pod is decided (core/isolation.py).
_ORDINARY_TAINTS = ("node.kubernetes.io/", "node-role.kubernetes.io/", "node.cloudprovider.kubernetes.io/",
                    "CriticalAddonsOnly")


def may_reach_gpu(pod: Mapping[str, Any]) -> bool:
    """Cheap structural test for a pod that asks for no GPU but may still get one, or set a device
    variable through envFrom: a RuntimeClass, spec.nodeName, a toleration of an unusual taint (or of
    every taint), or envFrom in any container. The core decides what these mean."""
    spec = mapping_of(pod.get("spec"))
    if spec.get("runtimeClassName") or spec.get("nodeName"):
        return True
    for toleration in list_of(spec.get("tolerations")):
        key = mapping_of(toleration).get("key")
        if not key or not isinstance(key, str) or not key.startswith(_ORDINARY_TAINTS):
            return True
    for key in ("containers", "initContainers"):
        for container in list_of(spec.get(key)):
            if mapping_of(container).get("envFrom"):
                return True
    return False


def needs_decision(pod: Mapping[str, Any]) -> bool:
    """What the webhook's fast path asks: a GPU pod, one with an accelerator to warn about, or one that
    may reach a GPU without asking."""
    return is_gpu_pod(pod) or has_foreign_accelerator(pod) or may_reach_gpu(pod)


def _number(value: object) -> Fraction | None:
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def kai_request(annotations: Mapping[str, Any]) -> tuple[GpuRequest | None, str | None]:
    """KAI-Scheduler's gpu-fraction / gpu-memory annotations as an NVIDIA request, or what is wrong."""
    fraction, memory = annotations.get(KAI_FRACTION), annotations.get(KAI_MEMORY)
    if fraction is None and memory is None:
        return None, None
    if fraction is not None and memory is not None:
        return None, f"annotations {KAI_FRACTION} and {KAI_MEMORY} are both set; keep one"
    count = 1
    devices = annotations.get(KAI_FRACTION_DEVICES)
    if devices is not None:
        parsed = _number(devices)
        if parsed is None or parsed.denominator != 1 or not 1 <= parsed <= MAX_GPUS:
            return None, f"annotation {KAI_FRACTION_DEVICES} is {devices!r}; write a whole number of GPUs such as 2"
        count = int(parsed)
    if fraction is not None:
        share = _number(fraction)
        if share is None or not 0 < share <= 1:
            return None, f'annotation {KAI_FRACTION} is {fraction!r}; write a fraction of one GPU in (0, 1], e.g. "0.5"'
        # KAI's fraction is a share of the card's memory; KAI caps no compute (the pods time-slice).
        pct = max(1, round(share * 100))
        return GpuRequest("nvidia", count, None, pct, None), None
    mib = _number(memory)
    if mib is None or mib.denominator != 1 or not 1 <= mib <= MAX_GPU_MEMORY_MIB:
        return None, f'annotation {KAI_MEMORY} is {memory!r}; write a whole number of MiB such as "2000"'
    return GpuRequest("nvidia", count, int(mib), None, None), None
