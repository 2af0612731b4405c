"""NVIDIA NIM operator's NIMService (apps.nvidia.com): the Deployment, or for a multi-node service the
LeaderWorkerSet, that the operator renders from the spec (k8s-nim-operator
`api/apps/v1alpha1/nimservice_types.go`: GetDeploymentParams, GetLWSParams, GetReplicas, GetLWSSize).

One container `<name>-ctr` with `spec.image`, `command`, `args`, `env` and `spec.resources`; the spec's
init and sidecar containers around it; `replicas`, or `scale.hpa.minReplicas` when autoscaling is on.
A spec without an `nvidia.com/gpu` is given GPUs by the operator from its NIMCache profile's tensor
parallelism (`spec.multiNode.parallelism.tensor` for a multi-node service), 1 when the profile states
none: decided at that figure, with a note.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from webhook.core.podspec import workload as labels

from .model import Builder, Context, Skipped, at, count, mapping, sequence

GPU = "nvidia.com/gpu"  # the name the operator assigns (addGPUResources)
_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "schedulerName", "runtimeClassName", "priorityClassName")


def _image(b: Builder, image: Any, path: str) -> str:
    image = mapping(b.doc, image, path)
    repository = image.get("repository")
    if not isinstance(repository, str) or not repository:
        raise b.doc.error(f"{path}.repository", "missing")
    return f"{repository}:{image['tag']}" if image.get("tag") else repository


def _extra(b: Builder, spec: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    """spec.initContainers / spec.sidecarContainers: NIMContainerSpec (image as repository and tag)."""
    out: list[dict[str, Any]] = []
    for index, entry in enumerate(sequence(b.doc, spec.get(key), f"spec.{key}", required=False)):
        path = f"spec.{key}[{index}]"
        entry = mapping(b.doc, entry, path)
        container = {k: copy.deepcopy(entry[k]) for k in ("name", "command", "args", "env", "workingDir") if k in entry}
        container["image"] = _image(b, entry.get("image"), f"{path}.image")
        out.append(container)
    return out


def _resources(spec: Mapping[str, Any], tensor: int | None) -> tuple[dict[str, Any], tuple[str, ...]]:
    resources = copy.deepcopy(dict(spec.get("resources") or {}))
    if any(GPU in (resources.get(k) or {}) for k in ("limits", "requests")):
        return resources, ()
    gpus = tensor or 1
    for key in ("limits", "requests"):
        resources[key] = {**(resources.get(key) or {}), GPU: gpus}
    how = "multiNode.parallelism.tensor" if tensor else "its NIMCache profile's tensor parallelism (1 when none)"
    return resources, (f"no {GPU} in spec.resources: the operator assigns {how}; decided at {gpus}",)


def nim_service(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    if spec.get("draResources"):
        raise b.doc.error("spec.draResources", "cannot decide: the GPUs come through DRA claims the operator "
                          "creates; decide the ResourceClaims and a pod naming them instead")
    pipeline = count(b.doc, mapping(b.doc, at(spec, "multiNode", "parallelism"), "spec.multiNode.parallelism",
                                    required=False), "pipeline", "spec.multiNode.parallelism.")
    tensor = at(spec, "multiNode", "parallelism", "tensor") if spec.get("multiNode") is not None else None
    resources, notes = _resources(spec, tensor if isinstance(tensor, int) and tensor > 0 else None)
    main = {"name": f"{b.name}-ctr", "image": _image(b, spec.get("image"), "spec.image"), "resources": resources}
    for key in ("command", "args", "env"):
        if spec.get(key) is not None:
            main[key] = copy.deepcopy(spec[key])
    pod: dict[str, Any] = {"containers": [main, *_extra(b, spec, "sidecarContainers")]}
    if spec.get("initContainers"):
        pod["initContainers"] = _extra(b, spec, "initContainers")
    for key in _POD_FIELDS:
        if spec.get(key) is not None:
            pod[key] = copy.deepcopy(spec[key])
    meta = {k: dict(spec[k]) for k in ("labels", "annotations") if isinstance(spec.get(k), Mapping)}
    replicas, scale = _replicas(b, spec)
    notes += scale
    if spec.get("inferencePlatform") == "kserve":
        notes += ("inferencePlatform kserve: served by an InferenceService the operator creates, same container",)
    if pipeline <= 1:
        b.pod(meta, pod, "spec", replicas, notes=notes)
        return
    # Multi-node: a LeaderWorkerSet of `replicas` groups, pipeline-parallel pods each (leader + workers).
    group = (f"multiNode pipeline parallelism {pipeline}: groups of {pipeline} pods",)
    b.pod(meta, pod, "spec", replicas, "leader", family=labels.LWS, notes=notes + group)
    b.pod(meta, pod, "spec", replicas * (pipeline - 1), "worker", family=labels.LWS, group_size=pipeline - 1,
          notes=notes + group)


def _replicas(b: Builder, spec: Mapping[str, Any]) -> tuple[int, tuple[str, ...]]:
    scale = mapping(b.doc, spec.get("scale"), "spec.scale", required=False)
    if scale.get("enabled") is True:
        hpa = mapping(b.doc, scale.get("hpa"), "spec.scale.hpa", required=False)
        low = count(b.doc, hpa, "minReplicas", "spec.scale.hpa.")
        return low, (f"autoscaled: decided at scale.hpa.minReplicas {low} (up to maxReplicas "
                     f"{hpa.get('maxReplicas', '?')})",)
    return count(b.doc, spec, "replicas", "spec."), ()


def nim_cache(b: Builder, ctx: Context) -> Skipped:
    """NIMCache: a Job that downloads the model, with cpu and memory only (nimcache_types.go Resources)."""
    return Skipped(b.doc.source, b.kind, b.name, b.namespace,
                   "NIMCache runs a model download Job that asks for no GPU; NIMServices serve it")


__all__ = ["nim_service", "nim_cache"]
