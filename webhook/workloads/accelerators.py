"""Accelerator asks anywhere in a document, so that `check` never passes one it did not decide.

A kind check knows puts some of its fields into the pods its controller makes; a kind it does not know
is walked for pod templates. Either way a GPU asked for somewhere else (an operator's own `resources`,
`gpu: {name, quantity}`, `numGpus: 2`) would reach no decided pod and the run would pass silently. This
walk finds those asks: every vendor resource name with a quantity above 0, KAI's share annotations,
`{name: <accelerator>, quantity: N}` pairs and, in kinds check does not know, keys that name GPUs
(`gpu`, `gpus`, `numGpus`, `gpuCount`, ...) with a number above 0. What lies under a decided pod
template, or a field the kind's handler read into a pod, is decided; anything else is an input error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any

from webhook.core.podspec.accelerators import looks_like_gpu
from webhook.core.podspec.kai import KAI_FRACTION, KAI_MEMORY
from webhook.core.podspec.quantity import QuantityError, parse_quantity
from webhook.core.podspec.vendor_table import is_gpu_resource

# Kubernetes' own API groups: their non-workload kinds (ResourceQuota, LimitRange, Node, ...) state
# capacity or limits with GPU names, they never ask for one. (Other projects' groups end in .k8s.io
# too, sparkoperator.k8s.io among them: only these are exempt.)
BUILT_IN_GROUPS: frozenset[str] = frozenset({
    "", "apps", "batch", "autoscaling", "policy", "extensions", "networking.k8s.io", "rbac.authorization.k8s.io",
    "storage.k8s.io", "scheduling.k8s.io", "node.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
    "admissionregistration.k8s.io", "apiextensions.k8s.io", "apiregistration.k8s.io", "certificates.k8s.io",
    "flowcontrol.apiserver.k8s.io", "events.k8s.io", "resource.k8s.io", "metrics.k8s.io",
})
# Kinds of other projects that state capacity, quotas or device configuration, not asks.
CAPACITY_KINDS: frozenset[tuple[str, str]] = frozenset({
    ("kueue.x-k8s.io", "ClusterQueue"), ("kueue.x-k8s.io", "LocalQueue"), ("kueue.x-k8s.io", "ResourceFlavor"),
    ("kueue.x-k8s.io", "Cohort"), ("kueue.x-k8s.io", "Topology"), ("scheduling.volcano.sh", "Queue"),
    ("scheduling.run.ai", "Queue"), ("scheduling.x-k8s.io", "ElasticQuota"), ("gpu-admission.io", "GPUInventory"),
    ("nvidia.com", "ClusterPolicy"), ("nvidia.com", "NVIDIADriver"), ("nfd.k8s-sigs.io", "NodeFeatureRule"),
    ("nfd.k8s-sigs.io", "NodeFeature"),
})
# Accelerator resources outside the vendor table whose names carry no accelerator word.
_OTHER_DOMAINS = ("gpu.intel.com/", "habana.ai/", "xilinx.com/", "amd.com/")
# Mappings of labels and selectors: GPU Feature Discovery's `nvidia.com/gpu.count: "8"` there selects
# nodes, it asks for nothing. Annotations are read for KAI's share keys only.
_LABELS = frozenset({"labels", "matchLabels", "nodeSelector", "selector", "annotations", "podLabels",
                     "podAnnotations", "nodeLabels", "serviceLabels", "serviceAnnotations"})
_NAME_KEYS = ("name", "resourceName", "resource")
_AMOUNT_KEYS = ("quantity", "count", "amount", "value", "limit", "number")
# gpu, gpus, numGpus, num_gpus, gpuCount, nGPUs, gpusPerNode, gpu-per-worker, totalGpus, ...
_GPU_COUNT_KEY = re.compile(r"(?:num|n|numof|total|min|max|requested)?gpus?(?:count|num|number|quantity|limit|"
                            r"request|amount|per[a-z]+)?")
_MAX_DEPTH = 40


def is_accelerator(name: str) -> bool:
    """A resource name that asks for an accelerator: the vendor table's, or another vendor's."""
    return is_gpu_resource(name) or looks_like_gpu(name) or name.startswith(_OTHER_DOMAINS)


def _positive(value: Any) -> bool:
    try:
        return parse_quantity(value) > Fraction(0)
    except QuantityError:
        return False


def _gpu_count_key(key: str) -> bool:
    return _GPU_COUNT_KEY.fullmatch(re.sub(r"[-_.]", "", key.lower())) is not None


def find(node: Any, loose: bool, path: str = "", depth: int = 0,
         seen: set[int] | None = None) -> Iterator[tuple[str, str]]:
    """(JSON pointer, what is asked) for each accelerator ask under `node`. `loose` adds GPU-named
    counts, read only in kinds check does not know (a known kind's `rayStartParams.num-gpus` tells its
    own runtime what it has, it asks the cluster for nothing)."""
    seen = set() if seen is None else seen
    if depth > _MAX_DEPTH or id(node) in seen:
        return
    if isinstance(node, list):
        seen.add(id(node))
        for index, item in enumerate(node):
            yield from find(item, loose, f"{path}/{index}", depth + 1, seen)
        return
    if not isinstance(node, Mapping):
        return
    seen.add(id(node))
    named = next((node[k] for k in _NAME_KEYS if isinstance(node.get(k), str)), None)
    amount = next((node[k] for k in _AMOUNT_KEYS if k in node), None)
    if named is not None and is_accelerator(named) and _positive(amount):
        yield path, f"{named}: {amount}"
    for key, value in node.items():
        if not isinstance(key, str) or (depth == 0 and key in ("metadata", "status")):
            continue
        here = f"{path}/{key.replace('~', '~0').replace('/', '~1')}"
        if key in (KAI_FRACTION, KAI_MEMORY) and _positive(value):
            yield here, f"{key}: {value}"
        elif key in _LABELS:
            if isinstance(value, Mapping):
                yield from ((f"{here}/{k}", f"{k}: {v}") for k, v in value.items()
                            if k in (KAI_FRACTION, KAI_MEMORY) and _positive(v))
        elif _asks(key, value, loose):
            yield here, f"{key}: {value}"
        else:
            yield from find(value, loose, here, depth + 1, seen)


def _asks(key: str, value: Any, loose: bool) -> bool:
    """A `key: value` pair that asks for accelerators by itself."""
    if isinstance(value, (Mapping, list)) or not _positive(value):
        return False
    return is_accelerator(key) or (loose and _gpu_count_key(key))


def covered(path: str, decided: Iterable[str]) -> bool:
    """Whether `path` lies inside one of the `decided` pointers ("" is the whole document)."""
    return any(not d or path == d or path.startswith(d + "/") for d in decided)


def exempt(group: str | None, kind: str) -> bool:
    """Kinds whose GPU names state capacity or configuration: Kubernetes' own, and CAPACITY_KINDS."""
    return group in BUILT_IN_GROUPS or (group or "", kind) in CAPACITY_KINDS


def undecided(data: Mapping[str, Any], decided: Iterable[str], loose: bool) -> list[tuple[str, str]]:
    """The asks in `data` outside the `decided` pointers."""
    paths = list(decided)
    return [(path, what) for path, what in find(data, loose) if not covered(path, paths)]


def dotted(pointer: str) -> str:
    """"/spec/resources/limits/nvidia.com~1gpu" -> "spec.resources.limits.nvidia.com/gpu"; list indexes
    as [i]."""
    out = ""
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out.lstrip(".")


__all__ = ["find", "undecided", "covered", "exempt", "is_accelerator", "dotted", "CAPACITY_KINDS"]
