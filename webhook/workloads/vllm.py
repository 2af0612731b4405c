"""vLLM production-stack's VLLMRuntime (production-stack.vllm.ai): the Deployment its operator builds
(production-stack `operator/internal/controller/vllmruntime_controller.go`, types in
`operator/api/v1alpha1/vllmruntime_types.go` and `common.go`).

One container `vllm` whose requests and limits are `deploymentConfig.resources` read as `cpu`,
`memory` and `gpu` of `gpuType` (default `nvidia.com/gpu`); with `sidecarConfig.enabled`, a sidecar
with its own such resources (0 GPUs of that type when it names none, as the operator writes it).
`deploymentConfig.replicas` pods (default 1); with `autoscalingConfig.enabled`, KEDA moves the replicas
between minReplicas (default 1) and maxReplicas, so the count is kept inside them (noted).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .model import Builder, Context, count, mapping, sequence

DEFAULT_GPU = "nvidia.com/gpu"


def _resources(b: Builder, given: Any, path: str, sidecar: bool = False) -> dict[str, Any]:
    """ResourceRequirements from the operator's {cpu, memory, gpu, gpuType}: each in requests and limits."""
    given = mapping(b.doc, given, path, required=False)
    out: dict[str, Any] = {}
    for key in ("cpu", "memory"):
        if given.get(key):
            out[key] = given[key]
    if sidecar and not out:
        out = {"cpu": "0.5", "memory": "128Mi"}  # the operator's sidecar defaults
    gpu_type = given.get("gpuType") or DEFAULT_GPU
    if given.get("gpu"):
        out[str(gpu_type)] = given["gpu"]
    elif sidecar:
        out[str(gpu_type)] = "0"
    return {"requests": dict(out), "limits": dict(out)} if out else {}


def _image(b: Builder, image: Any, path: str) -> str:
    image = mapping(b.doc, image, path)
    if not image.get("name"):
        raise b.doc.error(f"{path}.name", "missing")
    return f"{image.get('registry', '')}/{image['name']}"


def _env(b: Builder, given: Any, path: str) -> list[dict[str, Any]]:
    return [dict(mapping(b.doc, e, f"{path}[{i}]"))
            for i, e in enumerate(sequence(b.doc, given, path, required=False))]


def vllm_runtime(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    deploy = mapping(b.doc, spec.get("deploymentConfig"), "spec.deploymentConfig")
    path = "spec.deploymentConfig"
    model = mapping(b.doc, spec.get("model"), "spec.model", required=False)
    main: dict[str, Any] = {
        "name": "vllm", "image": _image(b, deploy.get("image"), f"{path}.image"),
        "command": ["/opt/venv/bin/vllm", "serve"], "args": [str(model.get("modelURL", ""))],
        "env": _env(b, mapping(b.doc, spec.get("vllmConfig"), "spec.vllmConfig", required=False).get("env"),
                    "spec.vllmConfig.env"),
        "resources": _resources(b, deploy.get("resources"), f"{path}.resources"),
    }
    containers = [main]
    sidecar = mapping(b.doc, deploy.get("sidecarConfig"), f"{path}.sidecarConfig", required=False)
    if sidecar.get("enabled") is True:
        side_path = f"{path}.sidecarConfig"
        containers.append({
            "name": str(sidecar.get("name") or ""), "image": _image(b, sidecar.get("image"), f"{side_path}.image"),
            "env": _env(b, sidecar.get("env"), f"{side_path}.env"),
            "resources": _resources(b, sidecar.get("resources"), f"{side_path}.resources", sidecar=True),
            **{k: copy.deepcopy(sidecar[k]) for k in ("command", "args") if sidecar.get(k) is not None},
        })
    pod: dict[str, Any] = {"containers": containers, "runtimeClassName": deploy.get("runtimeClass") or "nvidia"}
    if deploy.get("toleration") is not None:
        pod["tolerations"] = copy.deepcopy(deploy["toleration"])
    if deploy.get("nodeSelectorTerms") is not None:
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": copy.deepcopy(deploy["nodeSelectorTerms"])}}}
    meta = {"annotations": dict(deploy["podAnnotations"])} if isinstance(deploy.get("podAnnotations"), Mapping) else {}
    replicas, notes = _replicas(b, spec, deploy)
    b.pod(meta, pod, path, replicas, notes=notes)


def _replicas(b: Builder, spec: Mapping[str, Any], deploy: Mapping[str, Any]) -> tuple[int, tuple[str, ...]]:
    replicas = count(b.doc, deploy, "replicas", "spec.deploymentConfig.")
    scaling = mapping(b.doc, spec.get("autoscalingConfig"), "spec.autoscalingConfig", required=False)
    if scaling.get("enabled") is not True:
        return replicas, ()
    low = count(b.doc, scaling, "minReplicas", "spec.autoscalingConfig.")
    high = count(b.doc, scaling, "maxReplicas", "spec.autoscalingConfig.", default=max(replicas, low))
    kept = min(max(replicas, low), high)
    return kept, (f"autoscaled by KEDA between minReplicas {low} and maxReplicas {high}: decided at {kept}",)


__all__ = ["vllm_runtime"]
