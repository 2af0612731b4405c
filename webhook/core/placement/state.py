"""A snapshot's node index, and snapshots that count admitted-but-not-yet-seen pods (reservations),
derived without a rebuild: the index of each follows from its base's by the nodes that changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from webhook.core.domain.model import Allocation, Derived, Node, NodeUsage, Snapshot, Usage

from .nodeindex import NodeIndex, taken


def index_of(snapshot: Snapshot) -> NodeIndex:
    """The snapshot's node index: built on first use and kept with the snapshot. One built for other
    nodes or usage (a snapshot copied with `dataclasses.replace`) is never returned."""
    found = _own(snapshot)
    if found is not None:
        return found
    index = NodeIndex.build(snapshot.nodes, snapshot.usage)
    _keep(snapshot.derived, index, snapshot)
    return index


def with_usage(snapshot: Snapshot, changed: Mapping[str, NodeUsage], **fields: Any) -> Snapshot:
    """`snapshot` with these nodes' usage (and any other `fields`) replaced. Its index, when the base has
    built one, follows by the changed nodes alone (copy-on-write): a snapshot per admission never builds
    its own from scratch."""
    usage = {**snapshot.usage, **changed} if changed else snapshot.usage
    derived = replace(snapshot, usage=usage, derived=Derived(), **fields)
    carry_index(snapshot, derived, changed)
    return derived


def carry_index(previous: Snapshot, current: Snapshot, changed: Mapping[str, NodeUsage]) -> None:
    """Give `current` (the same nodes as `previous`, usage differing at most on `changed`) the index of
    `previous`, updated, when `previous` has one. The watch cache publishes its snapshots through this."""
    base = _own(previous)
    if base is None or current.nodes is not previous.nodes:
        return
    _keep(current.derived, base.updated(changed) if changed else base, current)


def _own(snapshot: Snapshot) -> NodeIndex | None:
    held = snapshot.derived
    if isinstance(held.index, NodeIndex) and held.nodes is snapshot.nodes and held.usage is snapshot.usage:
        return held.index
    return None


def _keep(held: Derived, index: NodeIndex, snapshot: Snapshot) -> None:
    held.index, held.nodes, held.usage = index, snapshot.nodes, snapshot.usage


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
    changed: dict[str, NodeUsage] = {}
    node = snapshot.nodes.get(allocation.node or "")
    if node is not None and allocation.gpus:
        changed[node.name] = add_to_node(node, snapshot.usage.get(node.name, NodeUsage()), allocation)
    return with_usage(snapshot, changed, namespace_usage=ns_usage)
