"""KServe: InferenceService components and LLMInferenceService, whose pod specs are written inline.

An InferenceService component (predictor, transformer, explainer) is a pod spec plus KServe's own fields
(minReplicas, scaleTarget, ...); a predictor may instead name a framework (`pytorch: {storageUri,
resources}`, `model: {modelFormat, resources}`), which becomes the pod's one serving container
(`kserve-container`), ahead of any containers listed. Components scale: each is decided at minReplicas
(default 1), with a note."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.podspec import workload as labels

from .model import Builder, Context, count, mapping, sequence

# Component fields that are KServe's, not the pod's
_EXTENSION = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType", "containerConcurrency",
    "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
    "autoScaling", "workerSpec", "storageUris",
}
FRAMEWORKS = ("model", "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "huggingface", "pmml",
              "lightgbm", "paddle", "art", "alibi")
_NOT_CONTAINER = {"storageUri", "runtimeVersion", "protocolVersion", "modelFormat", "runtime", "storage"}


def _component_pod(b: Builder, component: Mapping[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, pod spec) of one component."""
    spec = {k: v for k, v in component.items() if k not in _EXTENSION and k not in FRAMEWORKS}
    frameworks = [name for name in FRAMEWORKS if component.get(name) is not None]
    if len(frameworks) > 1:
        raise b.doc.error(path, f"names {len(frameworks)} frameworks ({', '.join(frameworks)}); a component has one")
    containers = list(sequence(b.doc, spec.get("containers"), f"{path}.containers", required=False))
    if frameworks:
        name = frameworks[0]
        fields = mapping(b.doc, component[name], f"{path}.{name}")
        container = {k: v for k, v in fields.items() if k not in _NOT_CONTAINER}
        container.setdefault("name", "kserve-container")
        container.setdefault("image", f"<{name} serving runtime>")
        containers.insert(0, container)
    if not containers:
        raise b.doc.error(path, "no containers and no framework (e.g. model: {modelFormat, storageUri}): runs nothing")
    spec["containers"] = containers
    meta: dict[str, Any] = {}
    for key in ("labels", "annotations"):
        if isinstance(component.get(key), dict):
            meta[key] = dict(component[key])
    return meta, spec


def _scale(b: Builder, component: Mapping[str, Any], path: str) -> tuple[int, tuple[str, ...]]:
    low = count(b.doc, component, "minReplicas", f"{path}.")
    high = component.get("maxReplicas")
    if high is not None and count(b.doc, component, "maxReplicas", f"{path}.") == low and low > 0:
        return low, ()
    top = f"maxReplicas {high}" if high is not None else "no maxReplicas"
    return low, (f"autoscaled: decided at minReplicas {low} ({top})",)


def inference_service(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    if spec.get("predictor") is None:
        raise b.doc.error("spec.predictor", "missing: every InferenceService has a predictor")
    for role in ("predictor", "transformer", "explainer"):
        if spec.get(role) is None:
            continue
        path = f"spec.{role}"
        component = mapping(b.doc, spec[role], path)
        meta, pod_spec = _component_pod(b, component, path)
        replicas, notes = _scale(b, component, path)
        b.pod(meta, pod_spec, path, replicas, role, family=labels.KSERVE, notes=notes)
        worker = component.get("workerSpec")
        if role == "predictor" and worker is not None:
            worker = mapping(b.doc, worker, f"{path}.workerSpec")
            stages = count(b.doc, worker, "pipelineParallelSize", f"{path}.workerSpec.", default=2)
            worker_spec = {k: v for k, v in worker.items() if k not in ("pipelineParallelSize", "tensorParallelSize")}
            if not worker_spec.get("containers"):
                raise b.doc.error(f"{path}.workerSpec.containers", "missing")
            b.pod({}, worker_spec, f"{path}.workerSpec", replicas * max(stages - 1, 0), "worker",
                  family=labels.KSERVE, notes=(f"pipelineParallelSize {stages}: {stages - 1} workers per predictor",))


def _llm_group(b: Builder, spec: Mapping[str, Any], path: str, prefix: str) -> None:
    replicas = count(b.doc, spec, "replicas", f"{path}.")
    template = spec.get("template")
    worker = spec.get("worker")
    if template is None and worker is None:
        if prefix:
            raise b.doc.error(f"{path}.template", "missing")
        raise b.doc.error(f"{path}.template", "missing: the pod spec comes from an LLMInferenceServiceConfig "
                          "(spec.baseRefs or the cluster's defaults), which check does not read")
    if template is not None:
        pod_spec = mapping(b.doc, template, f"{path}.template")
        b.pod({}, pod_spec, f"{path}.template", replicas, prefix or "workload", family=labels.LLMISVC)
    if worker is not None:
        # Multi-node: one LeaderWorkerSet group per replica, the template as leader and size-1 workers;
        # the size follows data / dataLocal parallelism, else pipeline parallelism.
        par = mapping(b.doc, spec.get("parallelism"), f"{path}.parallelism", required=False)
        data, local = par.get("data"), par.get("dataLocal")
        if isinstance(data, int) and isinstance(local, int) and local > 0:
            size, how = max(data // local, 1), f"data {data} / dataLocal {local}"
        elif isinstance(par.get("pipeline"), int):
            size, how = max(par["pipeline"], 1), f"pipeline {par['pipeline']}"
        else:
            size, how = 2, "no parallelism given: 1 worker"
        pod_spec = mapping(b.doc, worker, f"{path}.worker")
        b.pod({}, pod_spec, f"{path}.worker", replicas * (size - 1), f"{prefix}-worker" if prefix else "worker",
              family=labels.LWS, group_size=max(size - 1, 1), notes=(f"group size {size} ({how})",))


def llm_inference_service(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    _llm_group(b, spec, "spec", "")
    if spec.get("prefill") is not None:
        _llm_group(b, mapping(b.doc, spec["prefill"], "spec.prefill"), "spec.prefill", "prefill")
