"""What NVML says about this node's GPUs, as the inventory JSON of `webhook.core.podspec.inventory`.

NVLink count per GPU pair, the rule `nvidia-smi topo -m` follows (NV18 on a DGX H100, NV12 on a DGX A100):
  * a link whose remote end is a GPU of this node counts for that pair (bridged PCIe cards: NV4 between
    the two cards of a bridge); the pair gets the smaller of the two GPUs' counts of links to each other;
  * a link whose remote end is an NVSwitch counts for the GPU's switch links; the switches of one node
    form one fabric, so any two GPUs that both reach it get min(switch links of i, switch links of j)
    more (8 x H100 with 18 switch links each: NV18 between every pair; one GPU with a link down: NV17
    for its pairs);
  * other remote ends (IBM NPU, unknown) carry no GPU-to-GPU traffic and are not counted.
The remote end's type comes from nvmlDeviceGetNvLinkRemoteDeviceType; drivers without it are read by
remote PCI bus id: a bus id of one of this node's GPUs is a GPU, any other is a switch.

Health: a GPU is unhealthy when NVML reports it lost, a failed or pending row remapping (Ampere and
later: the card needs a reset or a replacement) or pending retired pages (earlier cards). These are the
persistent memory faults that make the next job on the card fail; transient XID events are left to the
device plugin's health stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from webhook.core.podspec.inventory import INVENTORY_VERSION

from .nvml import error_text, optional, text, unsupported

MIB = 1024 * 1024
NUMA_NODE_MASK_WORDS = 16  # 64-bit words of the NUMA node mask asked from NVML: 1024 nodes
_BUS_ID = re.compile(r"^\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F])\s*$")


@dataclass
class LinkReport:
    """One GPU's active NVLinks: counts per remote GPU index, switch links, remote bus ids in link order."""

    to_gpu: dict[int, int] = field(default_factory=dict)
    to_switch: int = 0
    remote_bus_ids: list[str] = field(default_factory=list)
    active: int = 0


def discover(nvml: Any) -> dict[str, Any]:
    """The node's inventory document: {"version", "gpus", "nvlink", "pcie"}, GPUs in NVML index order."""
    count = int(nvml.nvmlDeviceGetCount())
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus_ids = [normalise_bus_id(text(nvml.nvmlDeviceGetPciInfo(h).busId)) for h in handles]
    gpu_by_bus = {bus: index for index, bus in enumerate(bus_ids)}
    links = [read_links(nvml, h, gpu_by_bus) for h in handles]
    gpus = [describe_gpu(nvml, index, h, links[index]) for index, h in enumerate(handles)]
    return {
        "version": INVENTORY_VERSION,
        "gpus": gpus,
        "nvlink": nvlink_matrix(links),
        "pcie": pcie_matrix(nvml, handles),
    }


def driver_version(nvml: Any) -> str:
    """The driver version string, "" when NVML will not say."""
    try:
        return text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError:
        return ""


def describe_gpu(nvml: Any, index: int, handle: Any, links: LinkReport) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        "index": index,
        "uuid": text(nvml.nvmlDeviceGetUUID(handle)),
        "model": gfd_model_name(text(nvml.nvmlDeviceGetName(handle))),
        "memoryMiB": int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
        "numa": numa_node(nvml, handle),
        "healthy": is_healthy(nvml, handle),
    }
    mig = mig_mode(nvml, handle)
    if mig is not None:
        gpu["migMode"] = mig
    if mig:
        gpu["migDevices"] = mig_devices(nvml, handle)
    if links.active:
        gpu["nvlinkRemoteBusIds"] = list(links.remote_bus_ids)
    return gpu


def gfd_model_name(name: str) -> str:
    """GPU Feature Discovery's spelling of a product name: "NVIDIA A40" -> "NVIDIA-A40"."""
    return re.sub(r"\s+", "-", name.strip())


def normalise_bus_id(bus_id: str) -> str:
    """One spelling for PCI addresses: NVML writes "00000000:1B:00.0", sysfs "0000:1b:00.0"."""
    match = _BUS_ID.match(bus_id)
    if not match:
        return bus_id.strip().lower()
    domain, bus, device, function = (int(part or "0", 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def numa_node(nvml: Any, handle: Any) -> int:
    """The GPU's NUMA node: nvmlDeviceGetNumaNodeId (drivers 535+), else the lowest node of its memory
    affinity; 0 when neither is known (a single-node machine reports -1)."""
    try:
        node = int(optional(nvml, "nvmlDeviceGetNumaNodeId")(handle))
        return node if node >= 0 else 0
    except unsupported(nvml):
        pass
    try:
        mask = nvml.nvmlDeviceGetMemoryAffinity(handle, NUMA_NODE_MASK_WORDS, nvml.NVML_AFFINITY_SCOPE_NODE)
    except nvml.NVMLError:
        return 0
    for word_index, word in enumerate(mask):
        word = int(word)
        if word:
            return word_index * 64 + (word & -word).bit_length() - 1
    return 0


def is_healthy(nvml: Any, handle: Any) -> bool:
    """False for a lost GPU or one with a failed/pending row remapping or pending page retirement.

    A query this container may not make (no permission) is no evidence of a fault and is passed over.
    """
    try:
        _corrected, _uncorrected, pending, failure = optional(nvml, "nvmlDeviceGetRemappedRows")(handle)
        if pending or failure:
            return False
    except nvml.NVMLError_GpuIsLost:
        return False
    except nvml.NVMLError:
        pass
    try:
        if int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)) == nvml.NVML_FEATURE_ENABLED:
            return False
    except nvml.NVMLError_GpuIsLost:
        return False
    except nvml.NVMLError:
        pass
    return True


def mig_mode(nvml: Any, handle: Any) -> bool | None:
    """Whether MIG is enabled now; None for GPUs without MIG."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return None
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)


def mig_devices(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    """The MIG devices made on a GPU in MIG mode: profile (GFD's spelling, the name of the resource the
    device plugin advertises: `nvidia.com/mig-<profile>`), memory (NVML's memorySizeMB, what GFD's
    `.memory` label says) and UUID. Empty slots answer NotFound and are passed over."""
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except nvml.NVMLError:
        return []
    found: list[dict[str, Any]] = []
    for slot in range(slots):
        try:
            device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:
            continue
        profile = mig_profile_name(text(nvml.nvmlDeviceGetName(device)))
        try:
            memory = int(nvml.nvmlDeviceGetAttributes(device).memorySizeMB)
        except nvml.NVMLError:
            memory = int(nvml.nvmlDeviceGetMemoryInfo(device).total) // MIB
        if profile and memory > 0:
            found.append({"profile": profile, "memoryMiB": memory, "uuid": text(nvml.nvmlDeviceGetUUID(device))})
    return found


def mig_profile_name(name: str) -> str:
    """A MIG device's profile from NVML's name for it ("NVIDIA A100-SXM4-80GB MIG 1g.10gb+me" ->
    "1g.10gb.me"): GFD writes NVML's "+" as "." in resource names and labels."""
    _, marker, profile = name.rpartition(" MIG ")
    return profile.strip().replace("+", ".") if marker else ""


def read_links(nvml: Any, handle: Any, gpu_by_bus: dict[str, int]) -> LinkReport:
    """Walk the GPU's NVLinks and classify each active one by its remote end."""
    report = LinkReport()
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except nvml.NVMLError:
            continue  # no NVLink on this card, or fewer links than the maximum
        report.active += 1
        remote_bus = _remote_bus_id(nvml, handle, link)
        if remote_bus is not None:
            report.remote_bus_ids.append(remote_bus)
        kind = _remote_kind(nvml, handle, link, remote_bus, gpu_by_bus)
        if kind == "gpu" and remote_bus in gpu_by_bus:
            remote = gpu_by_bus[remote_bus]
            report.to_gpu[remote] = report.to_gpu.get(remote, 0) + 1
        elif kind == "switch":
            report.to_switch += 1
    return report


def _remote_bus_id(nvml: Any, handle: Any, link: int) -> str | None:
    try:
        return normalise_bus_id(text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
    except nvml.NVMLError:
        return None


def _remote_kind(nvml: Any, handle: Any, link: int, remote_bus: str | None, gpu_by_bus: dict[str, int]) -> str:
    try:
        kind = optional(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType")(handle, link)
    except nvml.NVMLError:
        kind = None
    if kind == nvml.NVML_NVLINK_DEVICE_TYPE_GPU:
        return "gpu"
    if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
        return "switch"
    if kind is not None or remote_bus is None:
        return "other"
    return "gpu" if remote_bus in gpu_by_bus else "switch"


def nvlink_matrix(links: list[LinkReport]) -> list[list[int]]:
    """Pairwise link counts under the rule in the module docstring: symmetric, 0 on the diagonal."""
    size = len(links)
    matrix = [[0] * size for _ in range(size)]
    for i in range(size):
        for j in range(i + 1, size):
            direct = min(links[i].to_gpu.get(j, 0), links[j].to_gpu.get(i, 0))
            via_switch = min(links[i].to_switch, links[j].to_switch)
            matrix[i][j] = matrix[j][i] = direct + via_switch
    return matrix


def pcie_level_names(nvml: Any) -> dict[int, str]:
    """NVML topology levels as `nvidia-smi topo -m` names them."""
    return {
        nvml.NVML_TOPOLOGY_INTERNAL: "PIX",
        nvml.NVML_TOPOLOGY_SINGLE: "PIX",
        nvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
        nvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
        nvml.NVML_TOPOLOGY_NODE: "NODE",
        nvml.NVML_TOPOLOGY_SYSTEM: "SYS",
    }


def pcie_matrix(nvml: Any, handles: list[Any]) -> list[list[str]]:
    """PCIe path level per pair from nvmlDeviceGetTopologyCommonAncestor; "X" on the diagonal.

    A pair NVML cannot place (some virtual machines) is taken as SYS, the farthest level, so placement
    never counts on a closeness it cannot see.
    """
    names = pcie_level_names(nvml)
    size = len(handles)
    matrix = [["X" if i == j else "SYS" for j in range(size)] for i in range(size)]
    for i in range(size):
        for j in range(i + 1, size):
            try:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
            except nvml.NVMLError:
                continue
            matrix[i][j] = matrix[j][i] = names.get(int(level), "SYS")
    return matrix


def describe_failure(err: BaseException) -> str:
    """One line for a discovery pass that NVML broke off."""
    return f"GPU discovery failed: {error_text(err)}"
