"""The watch cache's envFrom bookkeeping: which ConfigMaps hold keys that matter, and who reads them.

A ConfigMap is kept as the names of the keys that `envFrom` could turn into isolation variables, nothing
else (most keep none), so an update that changes no such key publishes nothing. What the live GPU pods
read of ConfigMaps through `envFrom` (core `isolation.env_reads`) is kept per namespace, and on publish
only the namespaces that changed are copied or rebuilt (`Snapshot.config_maps`, `Snapshot.env_readers`);
the others are shared with the previous snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping

from webhook.core.admission.configmap_readers import NO_POD_READS, Reads
from webhook.core.domain.model import EnvReader, Snapshot

from .translate import readers_of

ConfigMaps = Mapping[str, Mapping[str, frozenset[str]]]
EnvReaders = Mapping[str, Mapping[str, tuple[EnvReader, ...]]]


class EnvFromTables:
    """ConfigMaps' keys by namespace and name, and pods' envFrom reads by namespace."""

    def __init__(self) -> None:
        # namespace -> name -> the keys that matter (usually none: a shared empty set), and the
        # namespaces changed since the last snapshot (copied on publish, the rest shared).
        self.config_maps: dict[str, dict[str, frozenset[str]]] = {}
        self._changed_maps: set[str] = set()
        # pod key -> its reads, and namespace -> (ConfigMap, prefix, container) -> pod key -> pod name;
        # the namespaces changed since the last snapshot are rebuilt on publish.
        self._reads: dict[str, Reads] = {}
        self._readers: dict[str, dict[tuple[str, str, str], dict[str, str]]] = {}
        self._changed_readers: set[str] = set()

    def pending(self) -> bool:
        return bool(self._changed_maps or self._changed_readers)

    def keys(self) -> list[str]:
        return [f"{ns}/{name}" for ns, maps in self.config_maps.items() for name in maps]

    def keep(self, ns: str, name: str, keys: frozenset[str]) -> None:
        maps = self.config_maps.setdefault(ns, {})
        if maps.get(name) != keys or name not in maps:
            maps[name] = keys
            self._changed_maps.add(ns)

    def forget(self, key: str) -> None:
        ns, _, name = key.partition("/")
        maps = self.config_maps.get(ns, {})
        if maps.pop(name, None) is not None:
            self._changed_maps.add(ns)
            if not maps:
                del self.config_maps[ns]

    def set_reads(self, key: str, reads: Reads) -> None:
        """Record what pod `key` reads through envFrom now (NO_POD_READS: nothing, or gone)."""
        old = self._reads.get(key, NO_POD_READS)
        if old == reads:
            return
        for namespace, _, found in (old, reads):
            if found:
                self._changed_readers.add(namespace)
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

    def published(self, previous: Snapshot | None) -> tuple[ConfigMaps, EnvReaders]:
        """The snapshot's ConfigMaps and envFrom readers, sharing what did not change with `previous`."""
        config_maps: ConfigMaps
        if previous is None:
            config_maps = {ns: dict(maps) for ns, maps in self.config_maps.items()}
        elif self._changed_maps:
            config_maps = dict(previous.config_maps)
            for ns in self._changed_maps:
                if ns in self.config_maps:
                    config_maps[ns] = dict(self.config_maps[ns])
                else:
                    config_maps.pop(ns, None)
        else:
            config_maps = previous.config_maps
        self._changed_maps = set()
        env_readers: EnvReaders
        if previous is None or self._changed_readers:
            env_readers = dict(previous.env_readers) if previous is not None else {}
            for ns in self._changed_readers if previous is not None else list(self._readers):
                if ns in self._readers:
                    env_readers[ns] = readers_of({read: pods.values() for read, pods in self._readers[ns].items()})
                else:
                    env_readers.pop(ns, None)
        else:
            env_readers = previous.env_readers
        self._changed_readers = set()
        return config_maps, env_readers
