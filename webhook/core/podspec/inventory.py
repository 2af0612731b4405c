"""The GPU inventory format: the `spec` of a GPUInventory and the `gpu-admission.io/inventory` annotation.

One checker for every reader (the admission guard on GPUInventory writes, the cluster translation, the
node agent's own output), so a malformed inventory is refused with the same field-naming message
wherever it shows up.

    {"version": 1,
     "gpus": [{"index": 0, "uuid": "GPU-..", "model": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559,
               "numa": 0, "healthy": true, "migMode": false, "nvlinkRemoteBusIds": ["0000:05:00.0"]}],
     "nvlink": [[0]],          # NVLink link count per GPU pair, symmetric, 0 on the diagonal
     "pcie": [["X"]]}          # PCIe path level per pair (nvidia-smi topo -m), "X" on the diagonal only

Optional: `"vendor": "hygon"` (default nvidia: the devices' vendor, as in the vendor table), and per GPU in
MIG mode `"migDevices": [{"profile": "3g.20gb", "memoryMiB": 19968, "uuid": "MIG-.."}]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core.domain.model import Gpu

from .vendor_table import BY_NAME

INVENTORY_VERSION = 1
PCIE_LEVELS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
REQUIRED_GPU_FIELDS = ("index", "uuid", "model", "memoryMiB", "numa", "healthy")
OPTIONAL_GPU_FIELDS = ("migMode", "migDevices", "nvlinkRemoteBusIds")
MIG_DEVICE_FIELDS = ("profile", "memoryMiB", "uuid")
TOP_LEVEL_FIELDS = ("version", "gpus", "nvlink", "pcie")
OPTIONAL_TOP_LEVEL_FIELDS = ("toolkit", "vendor")
VENDORS = tuple(BY_NAME)  # the vendor table's vendors
# The node's NVIDIA container toolkit settings (config.toml), as the agent read them; absent: unknown.
TOOLKIT_FIELDS = ("configPath", "acceptEnvvarUnprivileged", "acceptVolumeMounts", "mode")

Matrix = tuple[tuple[int, ...], ...]
LevelMatrix = tuple[tuple[str, ...], ...]


class InventoryError(ValueError):
    """An inventory that breaks the format; the message starts with the offending field's path."""


def inventory_from_json(spec: Any, field: str = "spec") -> tuple[tuple[Gpu, ...], Matrix, LevelMatrix]:
    """Check an inventory document and return its GPUs and link matrices, in the document's GPU order.

    Raises InventoryError naming the first offending field (e.g. `spec.gpus[2].memoryMiB`).
    """
    if not isinstance(spec, Mapping):
        raise InventoryError(f"{field}: must be an object, got {_type_name(spec)}")
    _reject_unknown(spec, TOP_LEVEL_FIELDS + OPTIONAL_TOP_LEVEL_FIELDS, field)
    if "toolkit" in spec:
        toolkit_from_json(spec, field)
    vendor_from_json(spec, field)
    for key in TOP_LEVEL_FIELDS:
        if key not in spec:
            raise InventoryError(f"{field}.{key}: required")
    version = spec["version"]
    if not _is_int(version) or version != INVENTORY_VERSION:
        raise InventoryError(f"{field}.version: must be {INVENTORY_VERSION}, got {version!r}")
    gpus = _gpus(spec["gpus"], f"{field}.gpus")
    nvlink = _nvlink(spec["nvlink"], len(gpus), f"{field}.nvlink")
    pcie = _pcie(spec["pcie"], len(gpus), f"{field}.pcie")
    return gpus, nvlink, pcie


def toolkit_from_json(spec: Any, field: str = "spec") -> bool | None:
    """Whether the node's toolkit honours NVIDIA_VISIBLE_DEVICES from unprivileged containers
    (`toolkit.acceptEnvvarUnprivileged`); None when the inventory does not say."""
    toolkit = spec.get("toolkit") if isinstance(spec, Mapping) else None
    if toolkit is None:
        return None
    where = f"{field}.toolkit"
    if not isinstance(toolkit, Mapping):
        raise InventoryError(f"{where}: must be an object, got {_type_name(toolkit)}")
    _reject_unknown(toolkit, TOOLKIT_FIELDS, where)
    for key in ("configPath", "mode"):
        if key in toolkit:
            _text(toolkit[key], f"{where}.{key}")
    if "acceptVolumeMounts" in toolkit:
        _bool(toolkit["acceptVolumeMounts"], f"{where}.acceptVolumeMounts")
    if "acceptEnvvarUnprivileged" not in toolkit:
        return None
    return _bool(toolkit["acceptEnvvarUnprivileged"], f"{where}.acceptEnvvarUnprivileged")


def vendor_from_json(spec: Any, field: str = "spec") -> str:
    """The vendor of the inventory's devices (`vendor`, default nvidia): a DCU node stays a DCU node."""
    vendor = spec.get("vendor", "nvidia") if isinstance(spec, Mapping) else "nvidia"
    if vendor not in VENDORS:
        raise InventoryError(f"{field}.vendor: must be one of {', '.join(VENDORS)}, got {vendor!r}")
    return str(vendor)


def mig_from_json(spec: Any) -> list[tuple[str, int]]:
    """(profile, MiB) of every MIG device of a checked inventory, in GPU order."""
    gpus = spec.get("gpus") if isinstance(spec, Mapping) else None
    return [(d["profile"], d["memoryMiB"]) for g in gpus or () if isinstance(g, Mapping)
            for d in g.get("migDevices") or ()]


def mig_enabled_from_json(spec: Any) -> list[bool]:
    """Per GPU of a checked inventory, in its order: whether MIG mode is on (`migMode`)."""
    gpus = spec.get("gpus") if isinstance(spec, Mapping) else None
    return [isinstance(g, Mapping) and g.get("migMode") is True for g in gpus or ()]


def check_inventory(spec: Any, field: str = "spec") -> None:
    """Raise InventoryError when `spec` is not a valid inventory document."""
    inventory_from_json(spec, field)


def _gpus(value: Any, field: str) -> tuple[Gpu, ...]:
    items = _list(value, field)
    gpus: list[Gpu] = []
    seen_index: set[int] = set()
    seen_uuid: set[str] = set()
    for position, entry in enumerate(items):
        where = f"{field}[{position}]"
        gpu = _gpu(entry, where)
        if gpu.index in seen_index:
            raise InventoryError(f"{where}.index: duplicate index {gpu.index}")
        if gpu.uuid in seen_uuid:
            raise InventoryError(f"{where}.uuid: duplicate uuid {gpu.uuid!r}")
        seen_index.add(gpu.index)
        seen_uuid.add(gpu.uuid)
        gpus.append(gpu)
    return tuple(gpus)


def _gpu(entry: Any, where: str) -> Gpu:
    if not isinstance(entry, Mapping):
        raise InventoryError(f"{where}: must be an object, got {_type_name(entry)}")
    _reject_unknown(entry, REQUIRED_GPU_FIELDS + OPTIONAL_GPU_FIELDS, where)
    for key in REQUIRED_GPU_FIELDS:
        if key not in entry:
            raise InventoryError(f"{where}.{key}: required")
    index = _int(entry["index"], f"{where}.index", minimum=0)
    uuid = _text(entry["uuid"], f"{where}.uuid")
    model = _text(entry["model"], f"{where}.model")
    memory = _int(entry["memoryMiB"], f"{where}.memoryMiB", minimum=1)
    numa = _int(entry["numa"], f"{where}.numa", minimum=0)
    healthy = _bool(entry["healthy"], f"{where}.healthy")
    if "migMode" in entry:
        _bool(entry["migMode"], f"{where}.migMode")
    for position, device in enumerate(_list(entry.get("migDevices", []), f"{where}.migDevices")):
        at = f"{where}.migDevices[{position}]"
        if not isinstance(device, Mapping):
            raise InventoryError(f"{at}: must be an object, got {_type_name(device)}")
        _reject_unknown(device, MIG_DEVICE_FIELDS, at)
        for key in ("profile", "memoryMiB"):
            if key not in device:
                raise InventoryError(f"{at}.{key}: required")
        _text(device["profile"], f"{at}.profile")
        _int(device["memoryMiB"], f"{at}.memoryMiB", minimum=1)
        if "uuid" in device:
            _text(device["uuid"], f"{at}.uuid")
    if "nvlinkRemoteBusIds" in entry:
        for position, bus in enumerate(_list(entry["nvlinkRemoteBusIds"], f"{where}.nvlinkRemoteBusIds")):
            _text(bus, f"{where}.nvlinkRemoteBusIds[{position}]")
    return Gpu(index=index, uuid=uuid, model=model, memory_mib=memory, numa=numa, healthy=healthy)


def _nvlink(value: Any, size: int, field: str) -> Matrix:
    rows = _square(value, size, field)
    matrix = tuple(
        tuple(_int(cell, f"{field}[{i}][{j}]", minimum=0) for j, cell in enumerate(row)) for i, row in enumerate(rows)
    )
    for i in range(size):
        if matrix[i][i] != 0:
            raise InventoryError(f"{field}[{i}][{i}]: a GPU has no links to itself, must be 0")
        for j in range(i + 1, size):
            if matrix[i][j] != matrix[j][i]:
                raise InventoryError(
                    f"{field}[{j}][{i}]: must equal {field}[{i}][{j}] ({matrix[i][j]}), got {matrix[j][i]}"
                )
    return matrix


def _pcie(value: Any, size: int, field: str) -> LevelMatrix:
    rows = _square(value, size, field)
    levels: list[tuple[str, ...]] = []
    for i, row in enumerate(rows):
        cells: list[str] = []
        for j, cell in enumerate(row):
            where = f"{field}[{i}][{j}]"
            if not isinstance(cell, str) or cell not in PCIE_LEVELS:
                raise InventoryError(f"{where}: must be one of {', '.join(PCIE_LEVELS)}, got {cell!r}")
            if (cell == "X") != (i == j):
                expected = "X" if i == j else "a path level other than X"
                raise InventoryError(f"{where}: must be {expected}, got {cell!r}")
            cells.append(cell)
        levels.append(tuple(cells))
    for i in range(size):
        for j in range(i + 1, size):
            if levels[i][j] != levels[j][i]:
                raise InventoryError(
                    f"{field}[{j}][{i}]: must equal {field}[{i}][{j}] ({levels[i][j]}), got {levels[j][i]!r}"
                )
    return tuple(levels)


def _square(value: Any, size: int, field: str) -> list[Sequence[Any]]:
    rows = _list(value, field)
    if len(rows) != size:
        raise InventoryError(f"{field}: must have one row per GPU ({size}), got {len(rows)}")
    checked: list[Sequence[Any]] = []
    for i, row in enumerate(rows):
        cells = _list(row, f"{field}[{i}]")
        if len(cells) != size:
            raise InventoryError(f"{field}[{i}]: must have one entry per GPU ({size}), got {len(cells)}")
        checked.append(cells)
    return checked


def _reject_unknown(obj: Mapping[Any, Any], known: tuple[str, ...], field: str) -> None:
    for key in obj:
        if key not in known:
            raise InventoryError(f"{field}.{key}: unknown field (known: {', '.join(known)})")


def _list(value: Any, field: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise InventoryError(f"{field}: must be a list, got {_type_name(value)}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: Any, field: str, minimum: int) -> int:
    if not _is_int(value):
        raise InventoryError(f"{field}: must be an integer, got {value!r}")
    if value < minimum:
        raise InventoryError(f"{field}: must be at least {minimum}, got {value}")
    return int(value)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InventoryError(f"{field}: must be a non-empty string, got {value!r}")
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InventoryError(f"{field}: must be true or false, got {value!r}")
    return value


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)
