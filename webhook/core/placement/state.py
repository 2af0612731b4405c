"""Snapshots that count admitted-but-not-yet-seen pods (reservations), derived without a rebuild."""

from __future__ import annotations

from dataclasses import replace

from webhook.core.domain.model import Allocation, Node, NodeUsage, Snapshot, Usage

from .nodeindex import taken


def add_to_node(node: Node, usage: NodeUsage, allocation: Allocation) -> NodeUsage:
    """`usage` with the allocation's GPUs and host CPU and memory taken (indices the node does not have
    are ignored): a node whose CPU earlier admissions took is not offered again for what it cannot host."""
    gpus = tuple(i for i in allocation.gpus if 0 <= i < len(node.gpus))
    return taken(node, usage, gpus, allocation.memory_mib, allocation.cores, False, allocation.cpu_milli,
                 allocation.host_memory_mib)


def with_allocation(snapshot: Snapshot, namespace: str, allocation: Allocation) -> Snapshot:
    """A new snapshot counting one more admitted pod: its namespace's usage and, when placed, its node."""
    ns_usage = dict(snapshot.namespace_usage)
    ns_usage[namespace] = ns_usage.get(namespace, Usage()) + allocation.usage()
    usage = snapshot.usage
    cache: dict[str, object] = {}
    node = snapshot.nodes.get(allocation.node or "")
    if node is not None and allocation.gpus:
        changed = add_to_node(node, snapshot.usage.get(node.name, NodeUsage()), allocation)
        usage = dict(snapshot.usage)
        usage[node.name] = changed
        index = snapshot.cache.get("index")
        if index is not None:
            cache["index"] = index.updated({node.name: changed})
    elif "index" in snapshot.cache:
        cache["index"] = snapshot.cache["index"]
    return replace(snapshot, usage=usage, namespace_usage=ns_usage, cache=cache)
