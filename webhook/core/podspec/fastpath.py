"""The webhook's fast path: does a pod need a decision at all?

Asked of the raw object for every pod in a managed namespace, before any parsing, so it reads only the
few fields it needs, and each test it makes of a name is memoised by the name (`classify_resource`,
`looks_like_gpu`, the host-path guard). The chart's CEL matchConditions ask the same question
(charts/gpu-admission/templates/webhooks.yaml; tests/chart compares the two).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.domain.names import ALLOCATION

from .accelerators import has_foreign_accelerator
from .coerce import containers_of, list_of, mapping_of
from .envvars import is_bypass_entry
from .hostpaths import is_device_hostpath
from .kai import KAI_FRACTION, KAI_MEMORY
from .vendor_table import is_gpu_resource

# Annotations that make a pod a GPU pod on their own (a request, or our own decision record).
GPU_REQUEST_ANNOTATIONS: frozenset[str] = frozenset({KAI_FRACTION, KAI_MEMORY, ALLOCATION})


def is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    """Cheap test for the webhook's fast path: a GPU resource or a GPU annotation, nothing more."""
    annotations = mapping_of(mapping_of(pod.get("metadata")).get("annotations"))
    if annotations and not GPU_REQUEST_ANNOTATIONS.isdisjoint(annotations):
        return True
    spec = mapping_of(pod.get("spec"))
    for _, _, container in containers_of(spec):
        resources = mapping_of(container.get("resources"))
        for key in ("limits", "requests"):
            for resource in mapping_of(resources.get(key)):
                if isinstance(resource, str) and is_gpu_resource(resource):
                    return True
        for entry in list_of(container.get("env")):
            if is_bypass_entry(entry):
                return True
    return any(
        is_device_hostpath(mapping_of(mapping_of(v).get("hostPath")).get("path")) for v in list_of(spec.get("volumes"))
    )


# Toleration keys every pod carries (DefaultTolerationSeconds, DaemonSets) or that only concern control
# planes; any other key may be a GPU node's taint, so such a pod is decided (core/admission/no_gpu_reach.py).
_ORDINARY_TAINTS = ("node.kubernetes.io/", "node-role.kubernetes.io/", "node.cloudprovider.kubernetes.io/",
                    "CriticalAddonsOnly")


def may_reach_gpu(pod: Mapping[str, Any]) -> bool:
    """Cheap structural test for a pod that asks for no GPU but may still get one, or set a device
    variable through envFrom: a RuntimeClass, spec.nodeName, a toleration of an unusual taint (or of
    every taint), or envFrom in any container. The core decides what these mean."""
    spec = mapping_of(pod.get("spec"))
    if spec.get("runtimeClassName") or spec.get("nodeName"):
        return True
    for toleration in list_of(spec.get("tolerations")):
        key = mapping_of(toleration).get("key")
        if not key or not isinstance(key, str) or not key.startswith(_ORDINARY_TAINTS):
            return True
    for key in ("containers", "initContainers"):
        for container in list_of(spec.get(key)):
            if mapping_of(container).get("envFrom"):
                return True
    return False


def needs_decision(pod: Mapping[str, Any]) -> bool:
    """What the webhook's fast path asks: a GPU pod, one with an accelerator to warn about, or one that
    may reach a GPU without asking."""
    return is_gpu_pod(pod) or has_foreign_accelerator(pod) or may_reach_gpu(pod)
