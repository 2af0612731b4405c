"""What the watch cache keeps of each pod, and a node's usage added up from those records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.domain.model import GpuUsage, Node, NodeUsage, Usage

from .held import repeated
from .podusage import PodUsage, place_usage


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = meta_of(obj)
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class PodRecord:
    """What is kept of one pod: its GPU usage (None: holds no GPU) or host-only usage."""

    __slots__ = ("seq", "seen_gen", "seen_at", "use", "node", "namespace", "cpu", "memory", "taken")

    def __init__(self, seq: int, seen_gen: int, seen_at: float) -> None:
        self.seq = seq
        self.seen_gen = seen_gen
        self.seen_at = seen_at
        self.use: PodUsage | None = None
        self.node: str | None = None
        self.namespace = ""
        self.cpu = 0
        self.memory = 0
        self.taken = Usage()  # what it counts against its namespace's quotas


def appended_usage(node: Node, usage: NodeUsage, pod: PodRecord) -> NodeUsage:
    """`usage` with one more pod, placed last: what `node_usage` adds up when that pod has the newest
    `seq` and its recorded indices are neither a copy nor ahead of pods without recorded indices (the
    caller checks that; `ClusterCache` then spares a new pod's event the whole node's sum)."""
    if pod.use is None:
        return NodeUsage(usage.gpus, usage.cpu_milli + pod.cpu, usage.memory_mib + pod.memory, usage.gpu_tasks)
    gpus = list(usage.gpus) or [GpuUsage()] * len(node.gpus)
    place_usage(node, gpus, pod.use)
    return NodeUsage(tuple(gpus), usage.cpu_milli + pod.cpu, usage.memory_mib + pod.memory, usage.gpu_tasks + 1)


def node_usage(node: Node, pods: Iterable[PodRecord]) -> NodeUsage:
    """A node's usage from its pods, exactly as `build_snapshot` adds them up: pods with recorded GPU
    indices first, then the others in the order they were first seen, each on the least-used GPUs. A
    record that two pods present is a copy: neither's indices count (held.repeated)."""
    ordered = sorted(pods, key=lambda p: p.seq)
    copies = repeated(p.use.nonce for p in ordered if p.use is not None and p.use.gpus is not None and p.use.nonce)

    def placed(use: PodUsage) -> PodUsage:
        return replace(use, gpus=None) if copies and use.gpus is not None and use.nonce in copies else use

    ordered.sort(key=lambda p: p.use is None or placed(p.use).gpus is None)
    gpus: list[GpuUsage] = [GpuUsage()] * len(node.gpus)
    cpu = memory = tasks = 0
    for pod in ordered:
        if pod.use is not None:
            place_usage(node, gpus, placed(pod.use))
            tasks += 1
        cpu += pod.cpu
        memory += pod.memory
    return NodeUsage(tuple(gpus), cpu, memory, tasks)
