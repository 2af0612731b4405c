"""The watch cache: what the core needs of Nodes, GPUInventories, Namespaces, ResourceQuotas and Pods.

Each object is translated the moment it arrives and only the translation is kept. Node and namespace
usage are maintained incrementally (an event touches one node, `cache_usage.py`), and `snapshot()` hands
out a cached Snapshot, rebuilt only after something changed by copying the mappings that changed and
updating the placement index copy-on-write (`cache_publish.py`). The result equals
`translate.build_snapshot` over the same objects. What is kept of DRA claims, of ConfigMaps read through
envFrom, and of the optional kinds (group sizes, scale-from-zero pools) is in `cache_claims.py`,
`cache_envfrom.py` and `cache_optional.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.admission.configmap_readers import NO_POD_READS
from webhook.core.domain.model import Claim, Namespace, Node, QuotaLimits, Snapshot
from webhook.core.podspec.inventory import toolkit_from_json
from webhook.core.policy.model import DRA_DEVICE_CLASSES

from .cache_claims import CLAIM_ITEM_KINDS, CLAIM_KINDS, ClaimTables
from .cache_envfrom import EnvFromTables
from .cache_optional import POOL_KINDS, SIZE_KINDS, OptionalKinds
from .cache_publish import publish
from .cache_usage import UsageBook
from .pod_read import PodRead, read_pod
from .podrecords import PodRecord, meta_of, pod_key
from .translate import (
    claim_of,
    config_map_of,
    inventory_of,
    namespace_of,
    node_of,
    quotas_of,
)

log = logging.getLogger(__name__)

KINDS = ("nodes", "gpuinventories", "namespaces", "resourcequotas", "pods", "resourceclaims", "resourceclaimtemplates",
         "configmaps")
# SIZE_KINDS (the controllers' objects that state multi-pod groups' sizes) and POOL_KINDS (node pools that
# scale from zero) are watched besides KINDS, but not part of being synced or fresh (cache_optional.py).
__all__ = ["CLAIM_ITEM_KINDS", "CLAIM_KINDS", "KINDS", "POOL_KINDS", "SIZE_KINDS", "TOMBSTONE_SECONDS", "ClusterCache"]
TOMBSTONE_SECONDS = 900.0  # how long a deleted pod's UID is remembered (longer than any reservation)

Inventory = tuple[Any, Any, Any, bool | None]  # GPUs, NVLink, PCIe, toolkit honours the env var


class ClusterCache:
    """Implements `watch.WatchSink`; read by `snapshot()`, `view()` and `counted()`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 dra_classes: Callable[[], tuple[str, ...]] = lambda: DRA_DEVICE_CLASSES) -> None:
        self.clock = clock
        self.dra_classes = dra_classes  # the policy's GPU device classes, read at each publish
        self.errors = 0  # objects that could not be translated (logged, skipped)
        self._lock = threading.RLock()
        self._gen = 0
        self._seq = 0
        self._listed: set[str] = set()
        self._heard: dict[str, float] = {}
        self._first_lists = 0
        # nodes: the Node without its inventory, the inventory, and the Node the core sees
        self._base: dict[str, Node] = {}
        self._inventory: dict[str, Inventory] = {}
        self._nodes: dict[str, Node] = {}
        self._pods: dict[str, PodRecord] = {}
        self._tombstones: dict[str, tuple[int, float]] = {}
        self._swept = clock()
        self._namespaces: dict[str, Namespace] = {}
        self._quotas: dict[str, dict[str, QuotaLimits]] = {}
        self._book = UsageBook(self._nodes, self._pods)
        self._claims = ClaimTables()
        self._env = EnvFromTables()
        self._optional = OptionalKinds()
        # what changed since the last published snapshot (besides what the parts above keep)
        self._published: Snapshot | None = None
        self._dirty_nodes = True
        self._dirty: set[str] = {"namespaces", "quotas"}

    # -- WatchSink ------------------------------------------------------------------------------

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        keep: set[str] = set()
        # Before the first list nothing reads the cache: add node usage up once, after the first lists.
        first = kind not in self._listed
        if first:
            with self._lock:
                self._first_lists += 1
                self._book.defer()
        try:
            for obj in items:
                read = read_pod(obj) if kind == "pods" else None  # parsed before the lock: see apply
                with self._lock:
                    keep.add(self._key(kind, obj))
                    self._upsert(kind, obj, read)
                    self._gen += 1
        finally:
            if first:
                with self._lock:
                    self._first_lists -= 1
                    if self._first_lists == 0:
                        self._book.catch_up()
        with self._lock:
            for key in [k for k in self._keys(kind) if k not in keep]:
                self._delete(kind, key)
            self._listed.add(kind)
            self._gen += 1

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        # A pod is read (resources, usage, envFrom reads) before the lock that admissions take to read the
        # snapshot: a large pod costs its own event, never another tenant's admission.
        read = read_pod(obj) if kind == "pods" and event_type != "DELETED" else None
        with self._lock:
            if event_type == "DELETED":
                self._delete(kind, self._key(kind, obj))
            else:
                self._upsert(kind, obj, read)
            self._gen += 1

    def heard(self, kind: str) -> None:
        self._heard[kind] = self.clock()

    # -- readers --------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self.view()[0]

    def view(self) -> tuple[Snapshot, int]:
        """The current snapshot and the generation it reflects (for `counted`)."""
        with self._lock:
            self._claims.check_classes(self.dra_classes)
            if self._published is None or self._changed():
                self._published = publish(
                    self._published, nodes_changed=self._dirty_nodes, sections=self._dirty, nodes=self._nodes,
                    namespaces=self._namespaces, quotas=self._quotas, book=self._book, claims=self._claims,
                    env=self._env, optional=self._optional, classes=self.dra_classes())
                self._dirty_nodes = False
                self._dirty = set()
            return self._published, self._gen

    def _changed(self) -> bool:
        """Whether anything the snapshot holds changed since it was published."""
        return bool(self._dirty_nodes or self._dirty or self._book.changed or self._book.namespaces_changed
                    or self._claims.changed or self._env.pending() or self._optional.changed)

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
                "pods": self._book.gpu_pods,
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
            return list(self._claims.claims[kind])
        if kind in SIZE_KINDS or kind in POOL_KINDS:
            return self._optional.keys(kind)
        if kind == "configmaps":
            return self._env.keys()
        return [f"{ns}/{name}" for ns, quotas in self._quotas.items() for name in quotas]

    def _bad(self, kind: str, obj: Mapping[str, Any], error: Exception) -> None:
        self.errors += 1
        log.warning("%s %s: %s (ignored)", kind, meta_of(obj).get("name", "?"), error)

    def _upsert(self, kind: str, obj: Mapping[str, Any], read: PodRead | None = None) -> None:
        if kind == "pods":
            self._upsert_pod(obj, read)
        elif kind in POOL_KINDS or kind in SIZE_KINDS:
            self._optional.upsert(kind, self._key(kind, obj), obj)
        elif kind in CLAIM_KINDS:
            self._upsert_claim(kind, obj)
        elif kind == "configmaps":
            self._upsert_config_map(obj)
        elif kind in ("nodes", "gpuinventories"):
            self._upsert_node(kind, obj)
        elif kind == "namespaces":
            self._upsert_namespace(obj)
        elif kind == "resourcequotas":
            self._upsert_quota(obj)

    def _delete(self, kind: str, key: str) -> None:
        if kind == "pods":
            self._delete_pod(key)
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
            self._claims.put(kind, key, None)
        elif kind in SIZE_KINDS or kind in POOL_KINDS:
            self._optional.delete(kind, key)
        elif kind == "configmaps":
            self._env.forget(key)
        else:
            ns, _, name = key.partition("/")
            quotas = self._quotas.get(ns, {})
            if quotas.pop(name, None) is not None:
                self._dirty.add("quotas")
                if not quotas:
                    del self._quotas[ns]

    # -- nodes, namespaces, quotas --------------------------------------------------------------

    def _upsert_node(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = str(meta_of(obj).get("name", ""))
        if kind == "nodes":
            try:
                self._base[name] = node_of(obj)
            except ValueError as error:
                self._bad(kind, obj, error)
                self._base.pop(name, None)
        else:
            try:
                self._inventory[name] = (*inventory_of(obj.get("spec")), toolkit_from_json(obj.get("spec")))
            except ValueError as error:
                self._bad(kind, obj, error)
                self._inventory.pop(name, None)
        self._refresh_node(name)

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
            self._book.usage.pop(name, None)
        else:
            self._nodes[name] = node
        self._dirty_nodes = True
        self._book.recount(name)

    def _upsert_namespace(self, obj: Mapping[str, Any]) -> None:
        name = str(meta_of(obj).get("name", ""))
        try:
            namespace = namespace_of(obj)
        except ValueError as error:
            self._bad("namespaces", obj, error)
            self._delete("namespaces", name)
            return
        if self._namespaces.get(name) != namespace:
            self._namespaces[name] = namespace
            self._dirty.add("namespaces")

    def _upsert_quota(self, obj: Mapping[str, Any]) -> None:
        name = str(meta_of(obj).get("name", ""))
        ns = str(meta_of(obj).get("namespace") or "default")
        try:
            quota: QuotaLimits | None = quotas_of(obj)
        except ValueError as error:
            self._bad("resourcequotas", obj, error)
            quota = None
        if quota is None or (quota.gpus, quota.memory_mib, quota.cores) == (None, None, None):
            self._delete("resourcequotas", f"{ns}/{name}")
        elif self._quotas.get(ns, {}).get(name) != quota:
            self._quotas.setdefault(ns, {})[name] = quota
            self._dirty.add("quotas")

    # -- DRA claims and ConfigMaps --------------------------------------------------------------

    def _upsert_claim(self, kind: str, obj: Mapping[str, Any]) -> None:
        key = self._key(kind, obj)
        try:
            claim: Claim | None = claim_of(obj, CLAIM_ITEM_KINDS[kind])[1]
        except ValueError as error:
            self._bad(kind, obj, error)
            claim = None
        self._claims.put(kind, key, claim)

    def _upsert_config_map(self, obj: Mapping[str, Any]) -> None:
        try:
            ns, name, keys = config_map_of(obj)
        except ValueError as error:  # unreadable: forgotten, so a pod reading it finds it unresolved
            self._bad("configmaps", obj, error)
            self._env.forget(self._key("configmaps", obj))
            return
        self._env.keep(ns, name, keys)

    # -- pods -----------------------------------------------------------------------------------

    def _upsert_pod(self, obj: Mapping[str, Any], read: PodRead | None = None) -> None:
        read = read or read_pod(obj)
        if read.error is not None:
            self._bad("pods", obj, read.error)
        key = read.key
        self._claims.hold(key, read.namespace, read.refs)
        self._env.set_reads(key, read.reads)
        use, (node, cpu, memory) = read.use, read.host
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
            self._book.remove(key, pod)
        pod.use, pod.node, pod.cpu, pod.memory = use, node, cpu, memory
        pod.namespace = use.namespace if use is not None else ""
        self._book.add(key, pod, read.models, new)

    def _delete_pod(self, key: str) -> None:
        self._claims.release(key)
        self._env.set_reads(key, NO_POD_READS)
        pod = self._pods.pop(key, None)
        if pod is not None:
            self._book.remove(key, pod)
            self._tombstones[key] = (pod.seen_gen, pod.seen_at)
        else:
            self._tombstones.setdefault(key, (self._gen + 1, self.clock()))
        self._expire_tombstones()

    def _expire_tombstones(self) -> None:
        now = self.clock()
        if now - self._swept < 60.0:
            return
        self._swept = now
        horizon = now - TOMBSTONE_SECONDS
        for uid in [u for u, (_, at) in self._tombstones.items() if at < horizon]:
            del self._tombstones[uid]
