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
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.admission.dra import claim_refs, claim_users, held_usage, largest_card
from webhook.core.admission.isolation import NO_POD_READS, Reads, env_reads
from webhook.core.domain.model import (
    Claim,
    EnvReader,
    Namespace,
    Node,
    NodeUsage,
    QuotaLimits,
    ScalePool,
    Snapshot,
    Usage,
    usage_of,
)
from webhook.core.domain.names import ALLOCATION
from webhook.core.domain.shapes import Shape
from webhook.core.placement.groups import merge_sizes, sizes_of
from webhook.core.placement.mixlearn import Histogram
from webhook.core.placement.state import carry_index
from webhook.core.podspec.inventory import toolkit_from_json
from webhook.core.podspec.resources import is_gpu_pod
from webhook.core.policy.model import DRA_DEVICE_CLASSES

from .nodepools import POOL_KINDS as POOL_SPECS
from .nodepools import entry_of, ordered
from .observe import models_of, pod_shape
from .podrecords import PodRecord, appended_usage, meta_of, node_usage, pod_key
from .podusage import PodUsage
from .translate import (
    claim_of,
    config_map_of,
    host_usage_of,
    inventory_of,
    namespace_of,
    node_of,
    pod_usage_of,
    quotas_of,
    readers_of,
)

log = logging.getLogger(__name__)

KINDS = ("nodes", "gpuinventories", "namespaces", "resourcequotas", "pods", "resourceclaims", "resourceclaimtemplates",
         "configmaps")
# The controllers' objects that state multi-pod groups' sizes (kube.py GROUP_SIZE_KINDS): optional APIs
# (none served, or not readable: an empty list, looked for again), of which only namespace/name -> sizes
# is kept. Watched besides KINDS, but not part of being synced or fresh: without them a group is only
# open-ended (its pods state no size), as before their first list.
SIZE_KINDS = ("pytorchjobs", "tfjobs", "mpijobs", "jobsets", "rayclusters", "volcanojobs", "volcanopodgroups",
              "podgroups", "xgboostjobs", "paddlejobs", "jaxjobs")
# Node pools that scale from zero (nodepools.py POOL_KINDS): optional likewise, each kept as its pool.
POOL_KINDS = tuple(POOL_SPECS)
CLAIM_KINDS = ("resourceclaims", "resourceclaimtemplates")
CLAIM_ITEM_KINDS = {"resourceclaims": "ResourceClaim", "resourceclaimtemplates": "ResourceClaimTemplate"}
TOMBSTONE_SECONDS = 900.0  # how long a deleted pod's UID is remembered (longer than any reservation)

Inventory = tuple[Any, Any, Any, bool | None]  # GPUs, NVLink, PCIe, toolkit honours the env var


class ClusterCache:
    """Implements `watch.WatchSink`; read by `snapshot()`, `view()` and `counted()`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 dra_classes: Callable[[], tuple[str, ...]] = lambda: DRA_DEVICE_CLASSES) -> None:
        self.clock = clock
        self.dra_classes = dra_classes  # the policy's GPU device classes, read at each publish
        self._held_classes: tuple[str, ...] = ()
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
        self._pods: dict[str, PodRecord] = {}
        self._by_node: dict[str, set[str]] = {}
        # Per node, what decides whether a new pod's usage can be added on instead of summed anew
        # (podrecords.appended_usage): the nonces of its pods with recorded GPU indices, and how many
        # of its GPU pods have none, and how many of those nonces are copies (held by two pods or more:
        # such pods count as having none).
        self._nonces: dict[str, Counter[str]] = {}
        self._loose: Counter[str] = Counter()
        self._copies: Counter[str] = Counter()
        self._tombstones: dict[str, tuple[int, float]] = {}
        self._swept = clock()
        self._namespaces: dict[str, Namespace] = {}
        self._quotas: dict[str, dict[str, QuotaLimits]] = {}
        self._ns_usage: dict[str, list[Any]] = {}  # namespace -> [Usage, GPU pods counted]
        self._claims: dict[str, dict[str, Claim]] = {kind: {} for kind in CLAIM_KINDS}  # "ns/name" -> Claim
        # Group sizes by owner object: kind -> "ns/name" -> {GroupRef.key: size} (core groups.sizes_of)
        self._sizes: dict[str, dict[str, dict[str, int]]] = {kind: {} for kind in SIZE_KINDS}
        self._pools: dict[str, dict[str, tuple[int, ScalePool]]] = {kind: {} for kind in POOL_KINDS}  # weight, pool
        # Pods holding DRA claims: pod key -> (namespace, claim refs); their GPUs count with the claims'.
        self._dra_holders: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        # ConfigMaps read by envFrom: namespace -> name -> the keys that matter (usually none: a shared
        # empty set), and the namespaces changed since the last snapshot (copied on publish, the rest shared).
        self._config_maps: dict[str, dict[str, frozenset[str]]] = {}
        self._dirty_config_maps: set[str] = set()
        # What live GPU pods read of ConfigMaps through envFrom (core/isolation.py `env_reads`): pod key -> its
        # reads, and namespace -> (ConfigMap, prefix, container) -> pod key -> pod name; the namespaces
        # changed since the last snapshot are rebuilt on publish (Snapshot.env_readers).
        self._reads: dict[str, Reads] = {}
        self._readers: dict[str, dict[tuple[str, str, str], dict[str, str]]] = {}
        self._dirty_readers: set[str] = set()
        self._deferred: set[str] | None = None  # nodes whose usage is added up after the first lists
        self._first_lists = 0
        self._gpu_pods = 0
        # The held GPU pods by request shape (the learned workload mix's input), and each pod's shape
        # with the models it allows (kept to recompute its shape when its node's card size changes).
        self._observed = Histogram()
        self._shapes: dict[str, tuple[Shape | None, tuple[str, ...]]] = {}
        # what changed since the last published snapshot
        self._published: Snapshot | None = None
        self._dirty_nodes = True
        self._dirty_usage: set[str] = set()
        self._dirty: set[str] = {"namespaces", "quotas", "namespace_usage"}

    # -- WatchSink ------------------------------------------------------------------------------

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        keep: set[str] = set()
        # Before the first list nothing reads the cache: add node usage up once, after the first lists.
        first = kind not in self._listed
        if first:
            with self._lock:
                self._first_lists += 1
                if self._deferred is None:
                    self._deferred = set()
        try:
            for obj in items:
                with self._lock:
                    keep.add(self._key(kind, obj))
                    self._upsert(kind, obj)
                    self._gen += 1
        finally:
            if first:
                with self._lock:
                    self._first_lists -= 1
                    if self._first_lists == 0:
                        deferred, self._deferred = self._deferred, None
                        for name in deferred or ():
                            if name in self._nodes:
                                self._recompute_usage(name)
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
            if self._dra_holders and self.dra_classes() != self._held_classes:
                self._dirty.add("namespace_usage")  # the policy's GPU device classes changed
            if (self._published is None or self._dirty_nodes or self._dirty_usage or self._dirty
                    or self._dirty_config_maps or self._dirty_readers):
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

    def present(self, uid: str) -> bool:
        """True while the watch shows pod `uid` holding GPUs (pending or running, not finished)."""
        pod = self._pods.get(uid)
        return pod is not None and pod.use is not None

    def gone(self, uid: str) -> bool:
        """True when the watch saw pod `uid` deleted (remembered for TOMBSTONE_SECONDS)."""
        return uid in self._tombstones and uid not in self._pods

    def synced(self) -> bool:
        return not self.unsynced()

    def unsynced(self) -> list[str]:
        return [kind for kind in KINDS if kind not in self._listed]

    def silence(self, kind: str | None = None) -> float:
        """Seconds since the most silent watch (or the one of `kind`) last heard from the server
        (inf before its first list)."""
        now = self.clock()
        return max((now - self._heard[k] if k in self._heard else float("inf")) for k in ([kind] if kind else KINDS))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                "nodes": len(self._nodes),
                "pods": self._gpu_pods,
                "namespaces": len(self._namespaces),
            }

    # -- translation ----------------------------------------------------------------------------

    def _key(self, kind: str, obj: Mapping[str, Any]) -> str:
        if kind == "pods":
            return pod_key(obj)
        if kind in ("resourcequotas", "configmaps") or kind in CLAIM_KINDS or kind in SIZE_KINDS or kind in POOL_KINDS:
            return f"{meta_of(obj).get('namespace') or 'default'}/{meta_of(obj).get('name', '')}"
        return str(meta_of(obj).get("name", ""))

    def _keys(self, kind: str) -> list[str]:
        if kind == "pods":
            return list(self._pods)
        if kind == "nodes":
            return list(self._base)
        if kind == "gpuinventories":
            return list(self._inventory)
        if kind == "namespaces":
            return list(self._namespaces)
        if kind in CLAIM_KINDS:
            return list(self._claims[kind])
        if kind in SIZE_KINDS:
            return list(self._sizes[kind])
        if kind in POOL_KINDS:
            return list(self._pools[kind])
        if kind == "configmaps":
            return [f"{ns}/{name}" for ns, maps in self._config_maps.items() for name in maps]
        return [f"{ns}/{name}" for ns, quotas in self._quotas.items() for name in quotas]

    def _bad(self, kind: str, obj: Mapping[str, Any], error: Exception) -> None:
        self.errors += 1
        log.warning("%s %s: %s (ignored)", kind, meta_of(obj).get("name", "?"), error)

    def _upsert(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind in POOL_KINDS:
            key, entry, table = self._key(kind, obj), entry_of(obj), self._pools[kind]
            if table.get(key) != entry:
                if entry is None:
                    del table[key]
                else:
                    table[key] = entry
                self._dirty.add("scale_pools")
            return
        if kind in SIZE_KINDS:
            self._upsert_sizes(kind, obj)
        elif kind == "pods":
            self._upsert_pod(obj)
            return
        if kind in CLAIM_KINDS:
            self._upsert_claim(kind, obj)
            return
        if kind == "configmaps":
            self._upsert_config_map(obj)
            return
        name = str(meta_of(obj).get("name", ""))
        if kind == "nodes":
            try:
                self._base[name] = node_of(obj)
            except ValueError as error:
                self._bad(kind, obj, error)
                self._base.pop(name, None)
            self._refresh_node(name)
        elif kind == "gpuinventories":
            try:
                self._inventory[name] = (*inventory_of(obj.get("spec")), toolkit_from_json(obj.get("spec")))
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
            ns = str(meta_of(obj).get("namespace") or "default")
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
            if self._dra_holders.pop(key, None) is not None:
                self._dirty.update(("namespace_usage", "claim_users"))
            self._set_reads(key, NO_POD_READS)
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
        elif kind in CLAIM_KINDS:
            if self._claims[kind].pop(key, None) is not None:
                self._dirty.update((kind, "namespace_usage"))
        elif kind in SIZE_KINDS:
            if self._sizes[kind].pop(key, None) is not None:
                self._dirty.add("group_sizes")
        elif kind in POOL_KINDS:
            if self._pools[kind].pop(key, None) is not None:
                self._dirty.add("scale_pools")
        elif kind == "configmaps":
            ns, _, name = key.partition("/")
            maps = self._config_maps.get(ns, {})
            if maps.pop(name, None) is not None:
                self._dirty_config_maps.add(ns)
                if not maps:
                    del self._config_maps[ns]
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
            gpus, nvlink, pcie, toolkit = inventory
            node = replace(base, gpus=gpus, nvlink=nvlink, pcie=pcie, vendor="nvidia", inventory_source="inventory",
                           toolkit_envvar=toolkit)
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
            self._observe(uid, pod, None)
        if node is not None:
            self._recompute_usage(name)

    # -- DRA claims -----------------------------------------------------------------------------

    def _upsert_claim(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Keep only what counting needs (device requests, who holds the claim), so status churn
        (allocation results, conditions) that changes none of it publishes nothing."""
        key = self._key(kind, obj)
        try:
            claim: Claim | None = claim_of(obj, CLAIM_ITEM_KINDS[kind])[1]
        except ValueError as error:
            self._bad(kind, obj, error)
            claim = None
        table = self._claims[kind]
        if claim is None:
            if table.pop(key, None) is not None:
                self._dirty.update((kind, "namespace_usage"))
        elif table.get(key) != claim:
            table[key] = claim
            self._dirty.update((kind, "namespace_usage"))

    def _upsert_sizes(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Keep only the group sizes the object states: status churn (a job's pods running, a PodGroup's
        phase) changes none of them and publishes nothing."""
        key = self._key(kind, obj)
        sizes = sizes_of(obj)
        table = self._sizes[kind]
        if not sizes:
            if table.pop(key, None) is not None:
                self._dirty.add("group_sizes")
        elif table.get(key) != sizes:
            table[key] = sizes
            self._dirty.add("group_sizes")

    def _upsert_config_map(self, obj: Mapping[str, Any]) -> None:
        """Keep the names of the keys envFrom could turn into isolation variables, nothing else: most
        ConfigMaps keep none, and an update that changes no such key publishes nothing."""
        try:
            ns, name, keys = config_map_of(obj)
        except ValueError as error:  # unreadable: forgotten, so a pod reading it finds it unresolved
            self._bad("configmaps", obj, error)
            self._delete("configmaps", self._key("configmaps", obj))
            return
        maps = self._config_maps.setdefault(ns, {})
        if maps.get(name) != keys or name not in maps:
            maps[name] = keys
            self._dirty_config_maps.add(ns)

    # -- pods -----------------------------------------------------------------------------------

    def _upsert_pod(self, obj: Mapping[str, Any]) -> None:
        key = pod_key(obj)
        refs = claim_refs(obj)
        if refs != self._dra_holders.get(key, ("", ()))[1]:
            if refs:
                self._dra_holders[key] = (str(meta_of(obj).get("namespace") or "default"), refs)
            else:
                del self._dra_holders[key]
            self._dirty.update(("namespace_usage", "claim_users"))
        try:
            # Most pods hold no GPU: one cheap look settles that, and only their host usage is parsed.
            annotations = meta_of(obj).get("annotations")
            gpu_like = bool(is_gpu_pod(obj) or (isinstance(annotations, Mapping) and ALLOCATION in annotations))
            use = pod_usage_of(obj) if gpu_like else None
            host = host_usage_of(obj) if use is None else (None, 0, 0)
        except ValueError as error:
            self._bad("pods", obj, error)
            use, host, gpu_like = None, (None, 0, 0), True
        self._set_reads(key, env_reads(obj, gpu_like or bool(refs)))
        node, cpu, memory = (use.node, use.cpu_milli, use.memory_mib_host) if use is not None else host
        pod = self._pods.get(key)
        if pod is not None and pod.use == use and (pod.node, pod.cpu, pod.memory) == (node, cpu, memory):
            return  # a status update that changes nothing we count
        new = pod is None
        if pod is None:
            self._seq += 1
            stone = self._tombstones.pop(key, None)
            pod = PodRecord(self._seq, stone[0] if stone else self._gen + 1, stone[1] if stone else self.clock())
            self._pods[key] = pod
        else:
            self._unplace(key, pod)
        pod.use, pod.node, pod.cpu, pod.memory = use, node, cpu, memory
        pod.namespace = use.namespace if use is not None else ""
        appendable = new and pod.node is not None and self._appendable(pod.node, pod)
        if pod.node is not None:
            self._by_node.setdefault(pod.node, set()).add(key)
            self._index(pod.node, pod.use, +1)
        pod.taken = self._taken(pod)
        self._count(pod, +1)
        self._observe(key, pod, obj)
        if pod.node is not None and pod.node in self._nodes:
            if appendable:
                self._append_usage(pod.node, pod)
            else:
                self._recompute_usage(pod.node)

    def _appendable(self, name: str, pod: PodRecord) -> bool:
        """Whether a new pod (the newest `seq`) goes last in its node's sum, so that adding its usage on
        gives what `node_usage` would: it holds no recorded indices, or they are no copy and no pod
        without recorded indices comes after it."""
        if self._deferred is not None or name not in self._usage or name not in self._nodes:
            return False
        use = pod.use
        if use is None or use.gpus is None:
            return True
        nonces = self._nonces.get(name)
        copied = use.nonce and nonces and nonces[use.nonce]
        return not (self._loose[name] or self._copies[name] or copied)

    def _append_usage(self, name: str, pod: PodRecord) -> None:
        usage = appended_usage(self._nodes[name], self._usage[name], pod)
        if usage != self._usage[name]:
            self._usage[name] = usage
            self._dirty_usage.add(name)

    def _index(self, name: str, use: PodUsage | None, sign: int) -> None:
        if use is None:
            return
        if use.gpus is None:
            self._loose[name] += sign
            if self._loose[name] <= 0:
                del self._loose[name]
        elif use.nonce:
            nonces = self._nonces.setdefault(name, Counter())
            nonces[use.nonce] += sign
            if nonces[use.nonce] == (2 if sign > 0 else 1):  # a copy appeared or went
                self._copies[name] += sign
                if self._copies[name] <= 0:
                    del self._copies[name]
            if nonces[use.nonce] <= 0:
                del nonces[use.nonce]
                if not nonces:
                    del self._nonces[name]

    def _set_reads(self, key: str, reads: Reads) -> None:
        """Record what pod `key` reads through envFrom now (NO_POD_READS: nothing, or gone)."""
        old = self._reads.get(key, NO_POD_READS)
        if old == reads:
            return
        for namespace, _, found in (old, reads):
            if found:
                self._dirty_readers.add(namespace)
        if old[2]:
            table = self._readers[old[0]]
            for read in old[2]:
                pods = table[read]
                del pods[key]
                if not pods:
                    del table[read]
            if not table:
                del self._readers[old[0]]
        if reads[2]:
            self._reads[key] = reads
            table = self._readers.setdefault(reads[0], {})
            for read in reads[2]:
                table.setdefault(read, {})[key] = reads[1]
        else:
            self._reads.pop(key, None)

    def _observe(self, key: str, pod: PodRecord, obj: Mapping[str, Any] | None) -> None:
        """Count the pod's shape in the histogram (again, when its node changed: `obj` None)."""
        old, models = self._shapes.pop(key, (None, ()))
        self._observed.add(old, -1)
        if pod.use is None:
            return
        if obj is not None:
            models = models_of(obj, pod.use.vendor)
        shape = pod_shape(pod.use, models, self._nodes)
        self._shapes[key] = (shape, models)
        self._observed.add(shape)

    def _unplace(self, key: str, pod: PodRecord) -> None:
        self._observed.add(self._shapes.pop(key, (None, ()))[0], -1)
        self._count(pod, -1)
        if pod.node is not None:
            on_node = self._by_node.get(pod.node)
            if on_node is not None and key in on_node:
                self._index(pod.node, pod.use, -1)
                on_node.discard(key)
                if not on_node:
                    del self._by_node[pod.node]
            if pod.node in self._nodes:
                self._recompute_usage(pod.node)

    def _taken(self, pod: PodRecord) -> Usage:
        use = pod.use
        if use is None:
            return Usage()
        node = self._nodes.get(use.node or "")
        card = node.gpus[0].memory_mib if node is not None and node.gpus else 0
        return usage_of(use.vendor, use.mig, use.count, use.memory_on(card) * use.count, use.cores * use.count)

    def _count(self, pod: PodRecord, sign: int) -> None:
        if pod.use is None:
            return
        self._gpu_pods += sign
        entry = self._ns_usage.setdefault(pod.namespace, [Usage(), 0])
        entry[0] = entry[0] + pod.taken if sign > 0 else entry[0] - pod.taken
        entry[1] += sign
        if entry[1] == 0:
            del self._ns_usage[pod.namespace]
        self._dirty.add("namespace_usage")

    def _recompute_usage(self, name: str) -> None:
        """A node's usage from its pods, exactly as `build_snapshot` adds them up."""
        if self._deferred is not None:
            self._deferred.add(name)
            return
        usage = node_usage(self._nodes[name], [self._pods[uid] for uid in self._by_node.get(name, ())])
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
        changed: dict[str, NodeUsage] = {}
        if previous is None or self._dirty_nodes:
            nodes: Mapping[str, Node] = dict(self._nodes)
            usage: Mapping[str, NodeUsage] = dict(self._usage)  # one entry per node, kept in step
        else:
            nodes = previous.nodes
            if self._dirty_usage:
                changed = {n: self._usage[n] for n in self._dirty_usage if n in self._nodes}
                usage = {**previous.usage, **changed}
            else:
                usage = previous.usage
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
        classes = self.dra_classes()
        if self._dra_holders and ("namespace_usage" in dirty or previous is None or self._dirty_nodes
                                  or classes != self._held_classes):
            self._held_classes = classes
            ns_usage = {ns: entry[0] for ns, entry in self._ns_usage.items()}
            held = held_usage(self._dra_holders, self._claims["resourceclaims"], self._claims["resourceclaimtemplates"],
                              largest_card(self._nodes), classes)
            for namespace, use in held.items():
                ns_usage[namespace] = ns_usage.get(namespace, Usage()) + use
        users: Mapping[str, Mapping[tuple[str, str], int]] = (
            claim_users(self._dra_holders) if "claim_users" in dirty or previous is None else previous.claim_users
        )
        claims, templates = (
            dict(self._claims[kind]) if kind in dirty or previous is None else getattr(previous, field)
            for kind, field in zip(CLAIM_KINDS, ("claims", "claim_templates"), strict=True)
        )
        config_maps: Mapping[str, Mapping[str, frozenset[str]]]
        if previous is None:
            config_maps = {ns: dict(maps) for ns, maps in self._config_maps.items()}
        elif self._dirty_config_maps:
            config_maps = dict(previous.config_maps)
            for ns in self._dirty_config_maps:
                if ns in self._config_maps:
                    config_maps[ns] = dict(self._config_maps[ns])
                else:
                    config_maps.pop(ns, None)
        else:
            config_maps = previous.config_maps
        self._dirty_config_maps = set()
        env_readers: Mapping[str, Mapping[str, tuple[EnvReader, ...]]]
        if previous is None or self._dirty_readers:
            env_readers = dict(previous.env_readers) if previous is not None else {}
            for ns in self._dirty_readers if previous is not None else list(self._readers):
                if ns in self._readers:
                    env_readers[ns] = readers_of({read: pods.values() for read, pods in self._readers[ns].items()})
                else:
                    env_readers.pop(ns, None)
        else:
            env_readers = previous.env_readers
        self._dirty_readers = set()
        group_sizes: Mapping[str, int] = (
            merge_sizes(sizes for table in self._sizes.values() for sizes in table.values())
            if "group_sizes" in dirty or previous is None else previous.group_sizes
        )
        # a NodePool's limits count its nodes: its pool is read again when they change
        limited = self._dirty_nodes and any(p.limits for table in self._pools.values() for _, p in table.values())
        pools = (ordered((e for table in self._pools.values() for e in table.values()), self._nodes.values())
                 if "scale_pools" in dirty or previous is None or limited else previous.scale_pools)
        published = Snapshot(nodes, usage, namespaces, quotas, ns_usage, claims=claims, claim_templates=templates,
                             claim_users=users, config_maps=config_maps, env_readers=env_readers,
                             group_sizes=group_sizes, scale_pools=pools, observed=self._observed.view())
        if previous is not None:
            carry_index(previous, published, changed)  # copy-on-write, by the nodes whose usage changed
        self._published = published
        self._dirty_nodes = False
        self._dirty_usage = set()
        self._dirty = set()
