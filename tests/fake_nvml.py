"""A stand-in for `pynvml` with exactly the calls the node agent makes, and machines to load into it.

Names, argument lists, constants and error values are pynvml's (tests/agent/test_agent_fake_nvml.py holds the
fake to that), so what passes here is what the agent does on a real driver. The machines:

* DGX H100: 8 x H100 SXM, 18 NVLinks each, spread over 4 NVSwitches (5+4+4+5); two sockets.
* DGX A100: 8 x A100 SXM4 80GB, 12 NVLinks each, 2 to each of 6 NVSwitches; NPS4, a PCIe switch per pair.
* 8-GPU PCIe server: 8 x A40, NVLink bridges between 0-1, 2-3, 4-5, 6-7 (4 links each); an older driver
  without nvmlDeviceGetNumaNodeId (NUMA from memory affinity).
* 4-GPU PCIe box: 4 x L4, no NVLink, one socket, two host bridges.
* DGX A100 with MIG: the DGX A100, GPU 0 in MIG mode as 7 x 1g.10gb, GPU 1 as 2 x 3g.40gb plus one
  1g.10gb+me, GPU 2 in MIG mode with no device made yet (memory figures: NVML's memorySizeMB on A100 80GB).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

MIB = 1024 * 1024

# Error values and constants, as pynvml defines them.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    value = 999

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, "Unknown Error")


class NVMLError_Uninitialized(NVMLError):  # noqa: N801 - pynvml's names
    value = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    value = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    value = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NoPermission(NVMLError):  # noqa: N801
    value = NVML_ERROR_NO_PERMISSION


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    value = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    value = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_NotFound(NVMLError):  # noqa: N801
    value = NVML_ERROR_NOT_FOUND


class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801
    value = NVML_ERROR_FUNCTION_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    value = NVML_ERROR_GPU_IS_LOST


GPU, SWITCH = 0, 2  # NVML_NVLINK_DEVICE_TYPE_*
INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM = 0, 10, 20, 30, 40, 50  # NVML_TOPOLOGY_*


@dataclass(frozen=True)
class Link:
    remote_type: int
    remote_bus: str


@dataclass(frozen=True)
class Reading:
    used_mib: int = 1024
    utilization: int = 0  # percent
    temperature: int = 35  # Celsius
    power_mw: int | None = 70_000  # None: the board does not report power


@dataclass(frozen=True)
class FakeMig:
    """One MIG device: its profile as NVML names it ("1g.10gb", "1g.10gb+me") and its memory."""

    profile: str
    memory_mib: int
    uuid: str
    slot: int  # its index among the parent's MIG device handles (empty slots raise NotFound)


MAX_MIG_DEVICES = 7  # nvmlDeviceGetMaxMigDeviceCount on A100 and H100


@dataclass(frozen=True)
class FakeGpu:
    name: str
    uuid: str
    bus_id: str  # NVML's spelling, "00000000:18:00.0"
    memory_mib: int
    numa: int | None  # None: read it from the memory affinity mask
    link_slots: int = 0  # 0: no NVLink on this card (NotSupported)
    links: dict[int, Link] = field(default_factory=dict)  # active links by link number
    mig: int | None = None  # current MIG mode; None: no MIG
    mig_devices: tuple[FakeMig, ...] = ()
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # None: not supported
    retired_pending: int | None = None  # None: not supported (Ampere and later)
    lost: bool = False
    health_denied: bool = False  # health queries refused with NoPermission
    reading: Reading = Reading()


@dataclass(frozen=True)
class Handle:
    index: int


@dataclass(frozen=True)
class MigHandle:
    """A MIG device's handle: its parent GPU's index and its slot."""

    index: int
    slot: int


@dataclass
class Attributes:
    """pynvml's c_nvmlDeviceAttributes, the fields the agent reads."""

    memorySizeMB: int  # noqa: N815 - NVML's field name
    multiprocessorCount: int = 0  # noqa: N815


@dataclass
class PciInfo:
    busId: str  # noqa: N815 - NVML's field name


@dataclass
class Memory:
    total: int
    free: int
    used: int


@dataclass
class Utilization:
    gpu: int
    memory: int


class FakeNvml:
    """Module-like: `nvml.nvmlDeviceGetCount()`, `nvml.NVMLError_NotSupported`, ... Every call is logged
    in `calls`."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost

    NVML_NVLINK_MAX_LINKS = 36
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_DEVICE_TYPE_GPU = GPU
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
    NVML_NVLINK_DEVICE_TYPE_SWITCH = SWITCH
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 255
    NVML_TOPOLOGY_INTERNAL = INTERNAL
    NVML_TOPOLOGY_SINGLE = SINGLE
    NVML_TOPOLOGY_MULTIPLE = MULTIPLE
    NVML_TOPOLOGY_HOSTBRIDGE = HOSTBRIDGE
    NVML_TOPOLOGY_NODE = NODE
    NVML_TOPOLOGY_SYSTEM = SYSTEM
    NVML_AFFINITY_SCOPE_NODE = 0
    NVML_TEMPERATURE_GPU = 0

    def __init__(
        self,
        gpus: list[FakeGpu],
        levels: dict[tuple[int, int], int],
        *,
        init_error: type[NVMLError] | None = None,
        numa_id_supported: bool = True,
        remote_type_supported: bool = True,
        driver: str = "550.90.07",
    ) -> None:
        self.gpus = list(gpus)
        self.levels = dict(levels)
        self.init_error = init_error
        self.numa_id_supported = numa_id_supported
        self.remote_type_supported = remote_type_supported
        self.driver = driver
        self.calls: list[str] = []
        self.initialised = False

    # -- library --------------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("nvmlShutdown")
        self._ready()
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self.calls.append("nvmlSystemGetDriverVersion")
        self._ready()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self.calls.append("nvmlDeviceGetCount")
        self._ready()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:  # noqa: N802
        self.calls.append("nvmlDeviceGetHandleByIndex")
        self._ready()
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return Handle(index)

    # -- identity -------------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: Handle | MigHandle) -> str:  # noqa: N802
        if isinstance(handle, MigHandle):  # NVML names a MIG device "<parent name> MIG <profile>"
            return f"{self._gpu('nvmlDeviceGetName', Handle(handle.index)).name} MIG {self._mig(handle).profile}"
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Handle | MigHandle) -> str:  # noqa: N802
        if isinstance(handle, MigHandle):
            self.calls.append("nvmlDeviceGetUUID")
            return self._mig(handle).uuid
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        if gpu.mig is None:
            raise NVMLError_NotSupported()
        return MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> MigHandle:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if gpu.mig != self.NVML_DEVICE_MIG_ENABLE or not 0 <= index < MAX_MIG_DEVICES:
            raise NVMLError_InvalidArgument()
        if not any(d.slot == index for d in gpu.mig_devices):
            raise NVMLError_NotFound()
        return MigHandle(handle.index, index)

    def nvmlDeviceGetAttributes(self, handle: MigHandle) -> Attributes:  # noqa: N802
        self.calls.append("nvmlDeviceGetAttributes")
        if not isinstance(handle, MigHandle):
            raise NVMLError_NotSupported()  # attributes are a MIG device's
        return Attributes(memorySizeMB=self._mig(handle).memory_mib)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo:  # noqa: N802
        return PciInfo(self._gpu("nvmlDeviceGetPciInfo", handle).bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> Memory:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        total, used = gpu.memory_mib * MIB, gpu.reading.used_mib * MIB
        return Memory(total=total, free=total - used, used=used)

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetNumaNodeId", handle)
        if not self.numa_id_supported:
            raise NVMLError_FunctionNotFound()
        return -1 if gpu.numa is None else gpu.numa

    def nvmlDeviceGetMemoryAffinity(self, handle: Handle, nodeSetSize: int, scope: int) -> list[int]:  # noqa: N802, N803
        gpu = self._gpu("nvmlDeviceGetMemoryAffinity", handle)
        if scope != self.NVML_AFFINITY_SCOPE_NODE:
            raise NVMLError_InvalidArgument()
        mask = [0] * nodeSetSize
        if gpu.numa is not None:
            mask[gpu.numa // 64] |= 1 << (gpu.numa % 64)
        return mask

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.mig is None:
            raise NVMLError_NotSupported()
        return [gpu.mig, gpu.mig]

    # -- health ---------------------------------------------------------------------------------
    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if gpu.health_denied:
            raise NVMLError_NoPermission()
        if gpu.remapped_rows is None:
            raise NVMLError_NotSupported()
        return gpu.remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if gpu.health_denied:
            raise NVMLError_NoPermission()
        if gpu.retired_pending is None:
            raise NVMLError_NotSupported()
        return gpu.retired_pending

    # -- links ----------------------------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)
        self._link_slot(gpu, link)
        return self.NVML_FEATURE_ENABLED if link in gpu.links else self.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        if not self.remote_type_supported:
            raise NVMLError_FunctionNotFound()
        return self._active_link(gpu, link).remote_type

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> PciInfo:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        return PciInfo(self._active_link(gpu, link).remote_bus)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Handle, device2: Handle) -> int:  # noqa: N802
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device1)
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device2)
        if device1.index == device2.index:
            return INTERNAL
        pair = (min(device1.index, device2.index), max(device1.index, device2.index))
        if pair not in self.levels:
            raise NVMLError_NotSupported()
        return self.levels[pair]

    # -- readings -------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Utilization:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return Utilization(gpu=gpu.reading.utilization, memory=0)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument()
        return gpu.reading.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetPowerUsage", handle)
        if gpu.reading.power_mw is None:
            raise NVMLError_NotSupported()
        return gpu.reading.power_mw

    # -- plumbing -------------------------------------------------------------------------------
    def _ready(self) -> None:
        if not self.initialised:
            raise NVMLError_Uninitialized()

    def _gpu(self, call: str, handle: Any) -> FakeGpu:
        self.calls.append(call)
        self._ready()
        if not isinstance(handle, Handle) or not 0 <= handle.index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return self.gpus[handle.index]

    def _mig(self, handle: MigHandle) -> FakeMig:
        self._ready()
        if not 0 <= handle.index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        for device in self.gpus[handle.index].mig_devices:
            if device.slot == handle.slot:
                return device
        raise NVMLError_InvalidArgument()

    @staticmethod
    def _link_slot(gpu: FakeGpu, link: int) -> None:
        if gpu.link_slots == 0:
            raise NVMLError_NotSupported()
        if not 0 <= link < gpu.link_slots:
            raise NVMLError_InvalidArgument()

    def _active_link(self, gpu: FakeGpu, link: int) -> Link:
        self._link_slot(gpu, link)
        if link not in gpu.links:
            raise NVMLError_NotSupported()  # an inactive link has no remote end
        return gpu.links[link]


def pcie_bus(bus: int) -> str:
    return f"00000000:{bus:02X}:00.0"


def _symmetric_levels(size: int, level_of: Any) -> dict[tuple[int, int], int]:
    return {(i, j): level_of(i, j) for i in range(size) for j in range(i + 1, size)}


DGX_H100_GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
DGX_H100_SWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)
DGX_H100_LINKS_PER_SWITCH = (5, 4, 4, 5)


def _switch_links(switch_buses: tuple[int, ...], per_switch: tuple[int, ...]) -> dict[int, Link]:
    links: dict[int, Link] = {}
    for bus, count in zip(switch_buses, per_switch, strict=True):
        for _ in range(count):
            links[len(links)] = Link(SWITCH, pcie_bus(bus))
    return links


def dgx_h100(**options: Any) -> FakeNvml:
    links = _switch_links(DGX_H100_SWITCH_BUSES, DGX_H100_LINKS_PER_SWITCH)
    gpus = [
        FakeGpu(
            name="NVIDIA H100 80GB HBM3",
            uuid=f"GPU-h100000{i}-0000-4000-8000-00000000000{i}",
            bus_id=pcie_bus(bus),
            memory_mib=81559,
            numa=0 if i < 4 else 1,
            link_slots=18,
            links=dict(links),
            mig=0,
        )
        for i, bus in enumerate(DGX_H100_GPU_BUSES)
    ]
    levels = _symmetric_levels(8, lambda i, j: NODE if (i < 4) == (j < 4) else SYSTEM)
    return FakeNvml(gpus, levels, **options)


DGX_A100_GPU_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
DGX_A100_SWITCH_BUSES = (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9)


def dgx_a100(**options: Any) -> FakeNvml:
    links = _switch_links(DGX_A100_SWITCH_BUSES, (2, 2, 2, 2, 2, 2))
    numa = (3, 3, 1, 1, 7, 7, 5, 5)
    gpus = [
        FakeGpu(
            name="NVIDIA A100-SXM4-80GB",
            uuid=f"GPU-a100000{i}-0000-4000-8000-00000000000{i}",
            bus_id=pcie_bus(bus),
            memory_mib=81920,
            numa=numa[i],
            link_slots=12,
            links=dict(links),
            mig=0,
        )
        for i, bus in enumerate(DGX_A100_GPU_BUSES)
    ]
    levels = _symmetric_levels(8, lambda i, j: MULTIPLE if i // 2 == j // 2 else SYSTEM)
    return FakeNvml(gpus, levels, **options)


PCIE_SERVER_GPU_BUSES = (0x1A, 0x1B, 0x3D, 0x3E, 0x88, 0x89, 0xB1, 0xB2)


def pcie_server_bridged(**options: Any) -> FakeNvml:
    gpus = []
    for i, bus in enumerate(PCIE_SERVER_GPU_BUSES):
        partner_bus = pcie_bus(PCIE_SERVER_GPU_BUSES[i ^ 1])
        gpus.append(
            FakeGpu(
                name="NVIDIA A40",
                uuid=f"GPU-a4000000-0000-4000-8000-00000000000{i}",
                bus_id=pcie_bus(bus),
                memory_mib=46068,
                numa=0 if i < 4 else 1,
                link_slots=4,
                links={link: Link(GPU, partner_bus) for link in range(4)},
            )
        )

    def level(i: int, j: int) -> int:
        if i // 2 == j // 2:
            return SINGLE
        return MULTIPLE if (i < 4) == (j < 4) else SYSTEM

    options.setdefault("numa_id_supported", False)
    options.setdefault("driver", "470.256.02")
    return FakeNvml(gpus, _symmetric_levels(8, level), **options)


def pcie_box(**options: Any) -> FakeNvml:
    gpus = [
        FakeGpu(
            name="NVIDIA L4",
            uuid=f"GPU-14000000-0000-4000-8000-00000000000{i}",
            bus_id=pcie_bus(bus),
            memory_mib=23034,
            numa=None,  # single socket: NVML reports -1
            reading=Reading(
                used_mib=300 + i, utilization=10 * i, temperature=40 + i, power_mw=None if i == 3 else 27_500
            ),
        )
        for i, bus in enumerate((0x01, 0x02, 0x41, 0x42))
    ]
    levels = _symmetric_levels(4, lambda i, j: HOSTBRIDGE if i // 2 == j // 2 else NODE)
    return FakeNvml(gpus, levels, **options)


def dgx_a100_mig(**options: Any) -> FakeNvml:
    """The DGX A100 with GPU 0 as 7 x 1g.10gb, GPU 1 as 2 x 3g.40gb and a 1g.10gb+me, and GPU 2 in MIG
    mode with no device made yet."""
    nvml = dgx_a100(**options)
    small = tuple(FakeMig("1g.10gb", 9856, f"MIG-a1000000-0000-4000-8000-00000000000{s}", s) for s in range(7))
    mixed = (FakeMig("3g.40gb", 40192, "MIG-a1000001-0000-4000-8000-000000000000", 1),
             FakeMig("3g.40gb", 40192, "MIG-a1000001-0000-4000-8000-000000000001", 2),
             FakeMig("1g.10gb+me", 9856, "MIG-a1000001-0000-4000-8000-000000000002", 5))
    with_gpu(nvml, 0, mig=1, mig_devices=small)
    with_gpu(nvml, 1, mig=1, mig_devices=mixed)
    return with_gpu(nvml, 2, mig=1)


def with_gpu(nvml: FakeNvml, index: int, **changes: Any) -> FakeNvml:
    """The same machine with one GPU changed (health, MIG, readings)."""
    nvml.gpus[index] = replace(nvml.gpus[index], **changes)
    return nvml


FAKE_FUNCTIONS = tuple(sorted(name for name in vars(FakeNvml) if name.startswith("nvml")))
