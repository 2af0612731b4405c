"""The watch cache's optional kinds: the objects that size multi-pod groups, and the pools that scale from zero.

Both are optional APIs (none served, or not readable: an empty list, looked for again), watched besides
the cache's KINDS but not part of being synced or fresh. Of a controller's job object (kube.py
GROUP_SIZE_KINDS) only the group sizes it states are kept (core `groups.sizes_of`): without them a group
is only open-ended, as before their first list. Of a NodePool or node group (nodepools.py) only its pool
and weight are kept. Status churn that changes neither publishes nothing; a NodePool's limits count its
nodes, so its pool is published again when the nodes change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core.domain.model import Node, ScalePool, Snapshot
from webhook.core.placement.groups import merge_sizes, sizes_of

from .nodepools import POOL_KINDS as POOL_SPECS
from .nodepools import entry_of, ordered

SIZE_KINDS = ("pytorchjobs", "tfjobs", "mpijobs", "jobsets", "rayclusters", "volcanojobs", "volcanopodgroups",
              "podgroups", "xgboostjobs", "paddlejobs", "jaxjobs")
POOL_KINDS = tuple(POOL_SPECS)


class OptionalKinds:
    """Group sizes by owner object and pools by NodePool or node group, each keyed "ns/name"."""

    def __init__(self) -> None:
        # kind -> "ns/name" -> {GroupRef.key: size} (core groups.sizes_of)
        self._sizes: dict[str, dict[str, dict[str, int]]] = {kind: {} for kind in SIZE_KINDS}
        self._pools: dict[str, dict[str, tuple[int, ScalePool]]] = {kind: {} for kind in POOL_KINDS}  # weight, pool
        self.changed: set[str] = set()  # "group_sizes", "scale_pools": changed since the last publish

    def keys(self, kind: str) -> list[str]:
        return list(self._sizes[kind] if kind in SIZE_KINDS else self._pools[kind])

    def upsert(self, kind: str, key: str, obj: Mapping[str, Any]) -> None:
        if kind in POOL_KINDS:
            entry, table = entry_of(obj), self._pools[kind]
            if table.get(key) != entry:
                if entry is None:
                    del table[key]
                else:
                    table[key] = entry
                self.changed.add("scale_pools")
            return
        sizes = sizes_of(obj)
        sized = self._sizes[kind]
        if not sizes:
            if sized.pop(key, None) is not None:
                self.changed.add("group_sizes")
        elif sized.get(key) != sizes:
            sized[key] = sizes
            self.changed.add("group_sizes")

    def delete(self, kind: str, key: str) -> None:
        if kind in SIZE_KINDS:
            if self._sizes[kind].pop(key, None) is not None:
                self.changed.add("group_sizes")
        elif self._pools[kind].pop(key, None) is not None:
            self.changed.add("scale_pools")

    def published(self, previous: Snapshot | None, nodes: Iterable[Node], nodes_changed: bool,
                  ) -> tuple[Mapping[str, int], tuple[ScalePool, ...]]:
        """The snapshot's group sizes and scale pools, shared with `previous` when they did not change."""
        changed, self.changed = self.changed, set()
        group_sizes: Mapping[str, int] = (
            merge_sizes(sizes for table in self._sizes.values() for sizes in table.values())
            if "group_sizes" in changed or previous is None else previous.group_sizes
        )
        # a NodePool's limits count its nodes: its pool is read again when they change
        limited = nodes_changed and any(p.limits for table in self._pools.values() for _, p in table.values())
        pools = (ordered((e for table in self._pools.values() for e in table.values()), nodes)
                 if "scale_pools" in changed or previous is None or limited else previous.scale_pools)
        return group_sizes, pools
