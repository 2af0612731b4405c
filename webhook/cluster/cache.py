"""The watch cache: what the core needs of Nodes, GPUInventories, Namespaces, ResourceQuotas and Pods.

Each object is translated the moment it arrives and only the translation is kept. Node and namespace
usage are maintained incrementally (an event touches one node), and `snapshot()` hands out a cached
Snapshot, rebuilt only after something changed by copying the mappings that changed and updating the
placement index copy-on-write. The result equals `translate.build_snapshot` over the same objects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.model import GpuUsage, Namespace, Node, NodeUsage, QuotaLimits, Snapshot, Usage

from .translate import PodUsage, _host_only, _place, inventory_of, namespace_of, node_of, pod_usage_of, quotas_of

log = logging.getLogger(__name__)

KINDS = ("nodes", "gpuinventories", "namespaces", "resourcequotas", "pods")
TOMBSTONE_SECONDS = 900.0  # how long a deleted pod's UID is remembered (longer than any reservation)

Inventory = tuple[Any, Any, Any]
IDLE = NodeUsage()


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class _Pod:
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


class ClusterCache:
    """Implements `watch.WatchSink`; read by `snapshot()`, `view()` and `counted()`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.errors = 0  # objects that could not be translated (logged, skipped)
        self._lock = threading.RLock()
        self._gen = 0
        self._seq = 0
        self._listed: set[str] = set()
        self._heard: dict[str, float] = {}
        # nodes: the Node without its inventory, the inventory, and the Node the core sees
        self._base: dict[str, Node] = {}
        self._inventory: dict[str, Inventory] = {}
        self._nodes: dict[str, Node] = {}
        self._usage: dict[str, NodeUsage] = {}
        self._pods: dict[str, _Pod] = {}
        self._by_node: dict[str, set[str]] = {}
        self._tombstones: dict[str, tuple[int, float]] = {}
        self._swept = clock()
        self._namespaces: dict[str, Namespace] = {}
        self._quotas: dict[str, dict[str, QuotaLimits]] = {}
        self._ns_usage: dict[str, list[Any]] = {}  # namespace -> [Usage, GPU pods counted]
        # what changed since the last published snapshot
        self._published: Snapshot | None = None
        self._dirty_nodes = True
        self._dirty_usage: set[str] = set()
        self._dirty: set[str] = {"namespaces", "quotas", "namespace_usage"}

    # -- WatchSink ------------------------------------------------------------------------------

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        keep: set[str] = set()
        for obj in items:
            with self._lock:
                keep.add(self._key(kind, obj))
                self._upsert(kind, obj)
                self._gen += 1
        with self._lock:
            for key in [k for k in self._keys(kind) if k not in keep]:
                self._delete(kind, key)
            self._listed.add(kind)
            self._gen += 1

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            if event_type == "DELETED":
                self._delete(kind, self._key(kind, obj))
            else:
                self._upsert(kind, obj)
            self._gen += 1

    def heard(self, kind: str) -> None:
        self._heard[kind] = self.clock()

    # -- readers --------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self.view()[0]

    def view(self) -> tuple[Snapshot, int]:
        """The current snapshot and the generation it reflects (for `counted`)."""
        with self._lock:
            if self._published is None or self._dirty_nodes or self._dirty_usage or self._dirty:
                self._publish()
            assert self._published is not None
            return self._published, self._gen

    def counted(self, uid: str, generation: int) -> bool:
        """True when the snapshot of `generation` already reflects pod `uid` (running or gone), so a
        reservation for it must not be added on top."""
        pod = self._pods.get(uid)
        if pod is not None:
            return pod.seen_gen <= generation
        stone = self._tombstones.get(uid)
        return stone is not None and stone[0] <= generation

    def seen_at(self, uid: str) -> float | None:
        """When the watch first saw pod `uid` (clock seconds), or None."""
        pod = self._pods.get(uid)
        if pod is not None:
            return pod.seen_at
        stone = self._tombstones.get(uid)
        return stone[1] if stone is not None else None

    def synced(self) -> bool:
        return not self.unsynced()

    def unsynced(self) -> list[str]:
        return [kind for kind in KINDS if kind not in self._listed]

    def silence(self) -> float:
        """Seconds since the most silent watch last heard from the server (inf before the first list)."""
        now = self.clock()
        return max((now - self._heard[k] if k in self._heard else float("inf")) for k in KINDS)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                "nodes": len(self._nodes),
                "pods": sum(1 for p in self._pods.values() if p.use is not None),
                "namespaces": len(self._namespaces),
            }

    # -- translation ----------------------------------------------------------------------------

    def _key(self, kind: str, obj: Mapping[str, Any]) -> str:
        if kind == "pods":
            return pod_key(obj)
        if kind == "resourcequotas":
            return f"{_meta(obj).get('namespace') or 'default'}/{_meta(obj).get('name', '')}"
        return str(_meta(obj).get("name", ""))

    def _keys(self, kind: str) -> list[str]:
        if kind == "pods":
            return list(self._pods)
        if kind == "nodes":
            return list(self._base)
        if kind == "gpuinventories":
            return list(self._inventory)
        if kind == "namespaces":
            return list(self._namespaces)
        return [f"{ns}/{name}" for ns, quotas in self._quotas.items() for name in quotas]

    def _bad(self, kind: str, obj: Mapping[str, Any], error: Exception) -> None:
        self.errors += 1
        log.warning("%s %s: %s (ignored)", kind, _meta(obj).get("name", "?"), error)

    def _upsert(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "pods":
            self._upsert_pod(obj)
            return
        name = str(_meta(obj).get("name", ""))
        if kind == "nodes":
            try:
                self._base[name] = node_of(obj)
            except ValueError as error:
                self._bad(kind, obj, error)
                self._base.pop(name, None)
            self._refresh_node(name)
        elif kind == "gpuinventories":
            try:
                self._inventory[name] = inventory_of(obj.get("spec"))
            except ValueError as error:
                self._bad(kind, obj, error)
                self._inventory.pop(name, None)
            self._refresh_node(name)
        elif kind == "namespaces":
            try:
                namespace = namespace_of(obj)
            except ValueError as error:
                self._bad(kind, obj, error)
                self._delete(kind, name)
                return
            if self._namespaces.get(name) != namespace:
                self._namespaces[name] = namespace
                self._dirty.add("namespaces")
        elif kind == "resourcequotas":
            ns = str(_meta(obj).get("namespace") or "default")
            try:
                quota: QuotaLimits | None = quotas_of(obj)
            except ValueError as error:
                self._bad(kind, obj, error)
                quota = None
            if quota is None or (quota.gpus, quota.memory_mib, quota.cores) == (None, None, None):
                self._delete(kind, f"{ns}/{name}")
            elif self._quotas.get(ns, {}).get(name) != quota:
                self._quotas.setdefault(ns, {})[name] = quota
                self._dirty.add("quotas")

    def _delete(self, kind: str, key: str) -> None:
        if kind == "pods":
            pod = self._pods.pop(key, None)
            if pod is not None:
                self._unplace(key, pod)
                self._tombstones[key] = (pod.seen_gen, pod.seen_at)
            else:
                self._tombstones.setdefault(key, (self._gen + 1, self.clock()))
            self._expire_tombstones()
        elif kind == "nodes":
            if self._base.pop(key, None) is not None:
                self._refresh_node(key)
        elif kind == "gpuinventories":
            if self._inventory.pop(key, None) is not None:
                self._refresh_node(key)
        elif kind == "namespaces":
            if self._namespaces.pop(key, None) is not None:
                self._dirty.add("namespaces")
        else:
            ns, _, name = key.partition("/")
            quotas = self._quotas.get(ns, {})
            if quotas.pop(name, None) is not None:
                self._dirty.add("quotas")
                if not quotas:
                    del self._quotas[ns]

    def _refresh_node(self, name: str) -> None:
        """Recompute the Node the core sees from its base and inventory, and what depends on it."""
        base = self._base.get(name)
        node = base
        inventory = self._inventory.get(name)
        if base is not None and inventory is not None:
            gpus, nvlink, pcie = inventory
            node = replace(base, gpus=gpus, nvlink=nvlink, pcie=pcie, vendor="nvidia", inventory_source="inventory")
        if self._nodes.get(name) == node:
            return
        if node is None:
            del self._nodes[name]
            self._usage.pop(name, None)
        else:
            self._nodes[name] = node
        self._dirty_nodes = True
        # the card size sets what memory-less pods count against quotas: recount the node's pods
        for uid in self._by_node.get(name, ()):
            pod = self._pods[uid]
            self._count(pod, -1)
            pod.taken = self._taken(pod)
            self._count(pod, +1)
        if node is not None:
            self._recompute_usage(name)

    # -- pods -----------------------------------------------------------------------------------

    def _upsert_pod(self, obj: Mapping[str, Any]) -> None:
        key = pod_key(obj)
        try:
            use = pod_usage_of(obj)
            host = _host_only(obj) if use is None else (None, 0, 0)
        except ValueError as error:
            self._bad("pods", obj, error)
            use, host = None, (None, 0, 0)
        node, cpu, memory = (use.node, use.cpu_milli, use.memory_mib_host) if use is not None else host
        pod = self._pods.get(key)
        if pod is not None and pod.use == use and (pod.node, pod.cpu, pod.memory) == (node, cpu, memory):
            return  # a status update that changes nothing we count
        if pod is None:
            self._seq += 1
            stone = self._tombstones.pop(key, None)
            pod = _Pod(self._seq, stone[0] if stone else self._gen + 1, stone[1] if stone else self.clock())
            self._pods[key] = pod
        else:
            self._unplace(key, pod)
        pod.use, pod.node, pod.cpu, pod.memory = use, node, cpu, memory
        pod.namespace = use.namespace if use is not None else ""
        if pod.node is not None:
            self._by_node.setdefault(pod.node, set()).add(key)
        pod.taken = self._taken(pod)
        self._count(pod, +1)
        if pod.node is not None and pod.node in self._nodes:
            self._recompute_usage(pod.node)

    def _unplace(self, key: str, pod: _Pod) -> None:
        self._count(pod, -1)
        if pod.node is not None:
            on_node = self._by_node.get(pod.node)
            if on_node is not None:
                on_node.discard(key)
                if not on_node:
                    del self._by_node[pod.node]
            if pod.node in self._nodes:
                self._recompute_usage(pod.node)

    def _taken(self, pod: _Pod) -> Usage:
        use = pod.use
        if use is None:
            return Usage()
        node = self._nodes.get(use.node or "")
        card = node.gpus[0].memory_mib if node is not None and node.gpus else 0
        return Usage(use.count, use.memory_on(card) * use.count, use.cores * use.count)

    def _count(self, pod: _Pod, sign: int) -> None:
        if pod.use is None:
            return
        entry = self._ns_usage.setdefault(pod.namespace, [Usage(), 0])
        entry[0] = entry[0] + pod.taken if sign > 0 else entry[0] - pod.taken
        entry[1] += sign
        if entry[1] == 0:
            del self._ns_usage[pod.namespace]
        self._dirty.add("namespace_usage")

    def _recompute_usage(self, name: str) -> None:
        """A node's usage from its pods, exactly as `build_snapshot` adds them up."""
        node = self._nodes[name]
        pods = sorted((self._pods[uid] for uid in self._by_node.get(name, ())), key=lambda p: p.seq)
        pods.sort(key=lambda p: p.use is None or p.use.gpus is None)
        gpus: list[GpuUsage] = [GpuUsage()] * len(node.gpus)
        cpu = memory = tasks = 0
        for pod in pods:
            if pod.use is not None:
                _place(node, gpus, pod.use)
                tasks += 1
            cpu += pod.cpu
            memory += pod.memory
        usage = NodeUsage(tuple(gpus), cpu, memory, tasks)
        if self._usage.get(name) != usage:
            self._usage[name] = usage
            self._dirty_usage.add(name)

    def _expire_tombstones(self) -> None:
        now = self.clock()
        if now - self._swept < 60.0:
            return
        self._swept = now
        horizon = now - TOMBSTONE_SECONDS
        for uid in [u for u, (_, at) in self._tombstones.items() if at < horizon]:
            del self._tombstones[uid]

    # -- publishing -----------------------------------------------------------------------------

    def _publish(self) -> None:
        previous = self._published
        cache: dict[str, Any] = {}
        if previous is None or self._dirty_nodes:
            nodes: Mapping[str, Node] = dict(self._nodes)
            usage: Mapping[str, NodeUsage] = {n: self._usage.get(n, IDLE) for n in self._nodes}
        else:
            nodes = previous.nodes
            if self._dirty_usage:
                changed = {n: self._usage[n] for n in self._dirty_usage if n in self._nodes}
                usage = {**previous.usage, **changed}
                index = previous.cache.get("index")
                if index is not None:
                    cache["index"] = index.updated(changed)
            else:
                usage = previous.usage
                if "index" in previous.cache:
                    cache["index"] = previous.cache["index"]
        dirty = self._dirty if previous is not None else {"namespaces", "quotas", "namespace_usage"}
        namespaces: Mapping[str, Namespace] = (
            dict(self._namespaces) if "namespaces" in dirty or previous is None else previous.namespaces
        )
        quotas: Mapping[str, tuple[QuotaLimits, ...]] = (
            {ns: tuple(sorted(qs.values(), key=lambda q: q.name)) for ns, qs in self._quotas.items()}
            if "quotas" in dirty or previous is None
            else previous.quotas
        )
        ns_usage: Mapping[str, Usage] = (
            {ns: entry[0] for ns, entry in self._ns_usage.items()}
            if "namespace_usage" in dirty or previous is None
            else previous.namespace_usage
        )
        self._published = Snapshot(nodes, usage, namespaces, quotas, ns_usage, cache)
        self._dirty_nodes = False
        self._dirty_usage = set()
        self._dirty = set()
