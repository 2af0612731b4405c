"""What one pod event tells the watch cache, read before the cache's lock is taken.

Admissions take that lock to read the snapshot, so it is held only to store what was read: a pod's
resources, usage, DRA claim names, envFrom reads and GPU models are parsed here, on the watch thread,
in time linear in the pod, however large the pod is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.admission.configmap_readers import Reads, env_reads
from webhook.core.admission.dra import claim_refs
from webhook.core.domain.names import ALLOCATION
from webhook.core.podspec.resources import is_gpu_pod

from .observe import models_of
from .podrecords import meta_of, pod_key
from .podusage import PodUsage
from .translate import host_usage_of, pod_usage_of


@dataclass(frozen=True)
class PodRead:
    key: str
    namespace: str
    refs: Any  # the DRA claims it names (core/admission/dra.py claim_refs)
    use: PodUsage | None  # a GPU pod's usage; None for others
    host: tuple[str | None, int, int]  # node, CPU milli, host memory MiB
    reads: Reads  # the ConfigMaps it reads through envFrom
    models: tuple[str, ...]  # the GPU models its node constraints allow
    error: ValueError | None = None  # unreadable: counted as a GPU pod with no usage


def read_pod(obj: Mapping[str, Any]) -> PodRead:
    refs = claim_refs(obj)
    namespace = str(meta_of(obj).get("namespace") or "default")
    error: ValueError | None = None
    try:
        # Most pods hold no GPU: one cheap look settles that, and only their host usage is parsed.
        annotations = meta_of(obj).get("annotations")
        gpu_like = bool(is_gpu_pod(obj) or (isinstance(annotations, Mapping) and ALLOCATION in annotations))
        use = pod_usage_of(obj) if gpu_like else None
        host = host_usage_of(obj) if use is None else (use.node, use.cpu_milli, use.memory_mib_host)
    except ValueError as err:
        error, use, host, gpu_like = err, None, (None, 0, 0), True
    models = models_of(obj, use.vendor) if use is not None else ()
    return PodRead(pod_key(obj), namespace, refs, use, host, env_reads(obj, gpu_like or bool(refs)), models, error)
