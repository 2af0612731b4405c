"""Snapshots that count admitted-but-not-yet-seen pods (reservations), derived without a rebuild."""

from __future__ import annotations

from dataclasses import replace

from .model import Allocation, GpuUsage, Node, NodeUsage, Snapshot, Usage


def add_to_node(node: Node, usage: NodeUsage, allocation: Allocation, sign: int = 1) -> NodeUsage:
    """`usage` with the allocation's GPUs taken (sign=1) or given back (sign=-1)."""
    gpus = list(usage.gpus) or [GpuUsage() for _ in node.gpus]
    for index in allocation.gpus:
        if not 0 <= index < len(gpus):
            continue
        card = node.gpus[index].memory_mib
        before = gpus[index]
        exclusive = allocation.cores >= 100 and allocation.memory_mib >= card
        gpus[index] = GpuUsage(
            memory_mib=max(before.memory_mib + sign * allocation.memory_mib, 0),
            cores=max(before.cores + sign * allocation.cores, 0),
            tasks=max(before.tasks + sign, 0),
            exclusive=(before.exclusive or exclusive) if sign > 0 else (before.exclusive and not exclusive),
        )
    return replace(usage, gpus=tuple(gpus), gpu_tasks=max(usage.gpu_tasks + sign, 0))


def with_allocation(snapshot: Snapshot, namespace: str, allocation: Allocation, sign: int = 1) -> Snapshot:
    """A new snapshot counting (sign=1) or no longer counting (sign=-1) one admitted pod."""
    ns_usage = dict(snapshot.namespace_usage)
    before = ns_usage.get(namespace, Usage())
    ns_usage[namespace] = before + allocation.usage() if sign > 0 else before - allocation.usage()
    usage = snapshot.usage
    cache: dict[str, object] = {}
    node = snapshot.nodes.get(allocation.node or "")
    if node is not None and allocation.gpus:
        changed = add_to_node(node, snapshot.usage.get(node.name, NodeUsage()), allocation, sign)
        usage = dict(snapshot.usage)
        usage[node.name] = changed
        index = snapshot.cache.get("index")
        if index is not None:
            cache["index"] = index.updated({node.name: changed})
    elif "index" in snapshot.cache:
        cache["index"] = snapshot.cache["index"]
    return replace(snapshot, usage=usage, namespace_usage=ns_usage, cache=cache)
