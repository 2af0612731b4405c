"""Who reads which ConfigMap through `envFrom`: the live GPU pods whose environment a ConfigMap write can
change (`configmap_writes.py` decides the write against them).

The kubelet builds a container's environment, envFrom included, each time it starts the container
(makeEnvironmentVariables), so an edit of a ConfigMap reaches pods admitted before it at their next
restart. What each pod reads (`env_reads`) is what `Snapshot.env_readers` is built from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core.domain.model import EnvReader
from webhook.core.domain.names import ALLOCATION
from webhook.core.podspec.coerce import list_of, mapping_of
from webhook.core.podspec.fastpath import is_gpu_pod

from . import env_pins
from .dra import claim_refs
from .envfrom import label

ALL_KINDS = ("containers", "initContainers", "ephemeralContainers")
NO_READS: frozenset[tuple[str, str, str]] = frozenset()


def config_map_reads(pod: Mapping[str, Any]) -> frozenset[tuple[str, str, str]]:
    """(ConfigMap name, prefix, container label) of each envFrom of the pod that reads a ConfigMap with a
    prefix some key could turn into an isolation variable (a source with prefix APP_ is left out)."""
    found: set[tuple[str, str, str]] = set()
    spec = mapping_of(pod.get("spec"))
    for key in ALL_KINDS:
        for index, raw in enumerate(list_of(spec.get(key))):
            container = mapping_of(raw)
            entries = container.get("envFrom")
            if not entries:  # most containers: nothing more to read (nor a label to make)
                continue
            for entry in list_of(entries):
                source = mapping_of(entry)
                name = mapping_of(source.get("configMapRef")).get("name")
                given = source.get("prefix")
                prefix = given if isinstance(given, str) else ""
                if isinstance(name, str) and name and not env_pins.harmless(prefix):
                    found.add((name, prefix, label(key, index, container)))
    return frozenset(found) if found else NO_READS


Reads = tuple[str, str, frozenset[tuple[str, str, str]]]  # namespace, pod name, config_map_reads
NO_POD_READS: Reads = ("", "", NO_READS)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def env_reads(pod: Mapping[str, Any], gpu_like: bool | None = None) -> Reads:
    """What a live GPU pod (a GPU resource or variable, a decision record, or DRA claims) reads of
    ConfigMaps through envFrom (`config_map_reads`): what `Snapshot.env_readers` is built from, by the
    watch cache for the pods it shows and by the sources for the pods they reserved for. Other pods count
    for nothing: one that can reach a GPU node runs with NVIDIA_VISIBLE_DEVICES=void, which envFrom cannot
    override, and has no limit library to switch off. A finished pod restarts no container. `gpu_like`:
    already known."""
    reads = config_map_reads(pod)  # first: most pods read nothing, and that settles it
    if not reads or mapping_of(pod.get("status")).get("phase") in TERMINAL_PHASES:
        return NO_POD_READS
    metadata = mapping_of(pod.get("metadata"))
    if gpu_like is None:
        gpu_like = is_gpu_pod(pod) or ALLOCATION in mapping_of(metadata.get("annotations")) or bool(claim_refs(pod))
    if not gpu_like:
        return NO_POD_READS
    name = metadata.get("name") or metadata.get("generateName") or "?"
    return str(metadata.get("namespace") or "default"), str(name), reads


def with_env_reads(env_readers: Mapping[str, Mapping[str, tuple[EnvReader, ...]]], pods: Iterable[Reads]
                   ) -> Mapping[str, Mapping[str, tuple[EnvReader, ...]]]:
    """`env_readers` with the reads of more pods (none of them already counted there) added: each read
    joins the EnvReader of its (prefix, container), naming the first pod by name and counting it, as the
    cache builds them. Copies only the namespaces and ConfigMaps it changes."""
    out: dict[str, Mapping[str, tuple[EnvReader, ...]]] | None = None
    for namespace, pod, reads in pods:
        if not reads:
            continue
        if out is None:
            out = dict(env_readers)
        table = dict(out.get(namespace, {}))
        for config_map, prefix, where in reads:
            readers = list(table.get(config_map, ()))
            for i, reader in enumerate(readers):
                if (reader.prefix, reader.where) == (prefix, where):
                    readers[i] = EnvReader(prefix, where, min(reader.pod, pod), reader.pods + 1)
                    break
            else:
                readers.append(EnvReader(prefix, where, pod, 1))
            table[config_map] = tuple(sorted(readers))
        out[namespace] = table
    return env_readers if out is None else out
