"""The decision annotation `gpu-admission.io/allocation`: the allocation as JSON, both ways.

The watch cache reads it back to count running pods exactly as they were admitted, so the format is a
contract: keys are stable and unknown keys are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .model import Allocation, TopologyClass

ANNOTATION = "gpu-admission.io/allocation"


def allocation_to_json(allocation: Allocation) -> dict[str, Any]:
    return {
        "version": allocation.version,
        "node": allocation.node,
        "gpus": list(allocation.gpus),
        "uuids": list(allocation.uuids),
        "gpuCount": allocation.gpu_count,
        "memoryMiB": allocation.memory_mib,
        "cores": allocation.cores,
        "vendor": allocation.vendor,
        "model": allocation.model,
        "topology": allocation.topology.value,
        "loss": allocation.loss,
        "policy": allocation.policy,
    }


def _int(data: Mapping[str, Any], key: str, minimum: int = 0) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


_TOPOLOGY_CLASSES = {t.value: t for t in TopologyClass}


def allocation_from_json(data: Any) -> Allocation:
    """Parse the annotation's decoded JSON; ValueError names the key that is wrong."""
    if not isinstance(data, Mapping):
        raise ValueError("expected a JSON object")
    version = _int(data, "version", 1)
    if version != 1:
        raise ValueError(f"version: unsupported version {version}")
    node = data.get("node")
    if node is not None and not isinstance(node, str):
        raise ValueError(f"node: expected a string or null, got {node!r}")
    gpus = data.get("gpus", [])
    if not isinstance(gpus, list) or any(type(g) is not int or g < 0 for g in gpus):  # type(): not bool
        raise ValueError(f"gpus: expected a list of GPU indices, got {gpus!r}")
    uuids = data.get("uuids", [])
    if not isinstance(uuids, list) or any(type(u) is not str for u in uuids):
        raise ValueError(f"uuids: expected a list of strings, got {uuids!r}")
    count = _int(data, "gpuCount", 0)
    cores = _int(data, "cores", 0)
    if cores > 100:
        raise ValueError(f"cores: expected 0..100, got {cores}")
    topology_name = _str(data, "topology") or "single"
    topology = _TOPOLOGY_CLASSES.get(topology_name)  # a dict: the Enum call costs more than the rest
    if topology is None:
        raise ValueError(f"topology: unknown class {topology_name!r}")
    loss = data.get("loss", 0.0)
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss <= 1:
        raise ValueError(f"loss: expected a number in 0..1, got {loss!r}")
    return Allocation(
        node=node,
        gpus=tuple(gpus),
        gpu_count=count,
        memory_mib=_int(data, "memoryMiB", 0),
        cores=cores,
        vendor=_str(data, "vendor"),
        model=_str(data, "model"),
        topology=topology,
        loss=float(loss),
        policy=_str(data, "policy"),
        uuids=tuple(uuids),
        version=version,
    )
