"""Small hand-built clusters and pods for the allocation-core tests."""

from __future__ import annotations

from typing import Any

from webhook.core.domain.model import Gpu, GpuUsage, Namespace, Node, NodeUsage, QuotaLimits, Snapshot, Taint, Usage

H100 = ("NVIDIA-H100-80GB-HBM3", 81559)
A100 = ("NVIDIA-A100-SXM4-40GB", 40960)
L4 = ("NVIDIA-L4", 23034)


def nvswitch(n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(0 if i == j else 18 for j in range(n)) for i in range(n))


def paired(n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(4 if i != j and i // 2 == j // 2 else 0 for j in range(n)) for i in range(n))


def no_links(n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(0 for _ in range(n)) for _ in range(n))


def pcie(n: int, level: str = "SYS") -> tuple[tuple[str, ...], ...]:
    return tuple(tuple("X" if i == j else level for j in range(n)) for i in range(n))


def node(
    name: str,
    model: tuple[str, int],
    count: int,
    links: str = "nvswitch",
    cpu: int = 96000,
    memory: int = 512 * 1024,
    taints: tuple[Taint, ...] = (),
) -> Node:
    matrix = {"nvswitch": nvswitch, "paired": paired, "none": no_links}[links](count)
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", model[0], model[1], numa=i * 2 // max(count, 1)) for i in range(count))
    return Node(
        name,
        gpus,
        matrix,
        pcie(count),
        "nvidia",
        cpu,
        memory,
        {"nvidia.com/gpu.product": model[0]},
        taints,
        False,
        "inventory",
    )


def snapshot(
    *nodes: Node,
    usage: dict[str, NodeUsage] | None = None,
    quotas: dict[str, tuple[QuotaLimits, ...]] | None = None,
    used: dict[str, Usage] | None = None,
    namespaces: tuple[str, ...] = ("team-a", "team-b"),
) -> Snapshot:
    usage = dict(usage or {})
    for n in nodes:
        usage.setdefault(n.name, NodeUsage(tuple(GpuUsage() for _ in n.gpus)))
    spaces = {ns: Namespace(ns, {"gpu-admission.io/enabled": "true"}) for ns in namespaces}
    spaces["sandbox"] = Namespace("sandbox", {})
    return Snapshot({n.name: n for n in nodes}, usage, spaces, dict(quotas or {}), dict(used or {}))


def pod(
    limits: dict[str, Any] | None = None,
    *,
    name: str = "p",
    namespace: str = "team-a",
    annotations: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda:12"}
    if limits is not None:
        container["resources"] = {"limits": dict(limits)}
    if env is not None:
        container["env"] = env
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container], **spec}}
