"""Kubernetes objects -> the pods they make: each pod template with its role and pod count.

Kinds are matched by API group and kind (a Volcano `Job` is not a batch/v1 `Job`). Known kinds read their
templates where their controllers do; any other kind is walked for embedded pod templates. A document that
cannot be read or decided becomes a Problem of its own; the others are still decided.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.core.podspec import workload as labels
from webhook.manifests import Document, DocumentError, Problem

from . import accelerators, argo, katib, kinds, nim, ray, serving, spark, trainer, vllm
from .claims import ClaimObject, is_claim_object
from .model import Builder, Context, Result, Skipped, Workload, mapping
from .walk import walk

Handler = Callable[[Builder, Context], "Skipped | None"]

_CORE: dict[str, Handler] = {
    "Pod": kinds.pod,
    "Deployment": kinds.replicated,
    "StatefulSet": kinds.replicated,
    "ReplicaSet": kinds.replicated,
    "ReplicationController": kinds.replicated,
    "DaemonSet": kinds.daemon_set,
    "Job": kinds.job,
    "CronJob": kinds.cron_job,
}
_CORE_GROUPS = {"Pod": ("",), "ReplicationController": ("",), "Job": ("batch",), "CronJob": ("batch",)}

# (API group, kind) -> how its pods are found, and the controller family whose labels they carry
KINDS: dict[tuple[str, str], tuple[Handler, str]] = {
    **{(group, kind): (handler, "")
       for kind, handler in _CORE.items() for group in _CORE_GROUPS.get(kind, ("apps", "extensions"))},
    **{("kubeflow.org", kind): (kinds.training, labels.TRAINING) for kind in kinds.REPLICA_SPECS},
    ("trainer.kubeflow.org", "TrainJob"): (trainer.train_job, labels.JOBSET),
    ("trainer.kubeflow.org", "TrainingRuntime"): (trainer.runtime, ""),
    ("trainer.kubeflow.org", "ClusterTrainingRuntime"): (trainer.runtime, ""),
    ("jobset.x-k8s.io", "JobSet"): (kinds.job_set, labels.JOBSET),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): (kinds.leader_worker_set, labels.LWS),
    ("batch.volcano.sh", "Job"): (kinds.volcano_job, labels.VOLCANO),
    ("ray.io", "RayCluster"): (ray.ray_cluster, labels.RAY),
    ("ray.io", "RayJob"): (ray.ray_job, labels.RAY),
    ("ray.io", "RayService"): (ray.ray_service, labels.RAY),
    ("serving.kserve.io", "InferenceService"): (serving.inference_service, labels.KSERVE),
    ("serving.kserve.io", "LLMInferenceService"): (serving.llm_inference_service, labels.LLMISVC),
    ("apps.nvidia.com", "NIMService"): (nim.nim_service, ""),
    ("apps.nvidia.com", "NIMCache"): (nim.nim_cache, ""),
    ("production-stack.vllm.ai", "VLLMRuntime"): (vllm.vllm_runtime, ""),
    ("sparkoperator.k8s.io", "SparkApplication"): (spark.spark_application, ""),
    ("sparkoperator.k8s.io", "ScheduledSparkApplication"): (spark.scheduled_spark_application, ""),
}
ARGO_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")
# Kinds whose pods are those of another object they embed, decided with pod_templates itself
Nested = Callable[[Builder, Context, Any, Callable[[str, str], str]], "Skipped | None"]
NESTED: dict[tuple[str, str], Nested] = {
    **{("argoproj.io", kind): argo.workflow for kind in ARGO_KINDS},
    ("kubeflow.org", "Experiment"): katib.experiment,
}

# Kinds that hold pod templates but run no pods themselves: other objects use their templates.
TEMPLATE_HOLDERS = {
    ("", "PodTemplate"): "PodTemplate runs no pods: controllers copy from it",
    ("serving.kserve.io", "ServingRuntime"): "ServingRuntime runs no pods by itself: InferenceServices use it",
    ("serving.kserve.io", "ClusterServingRuntime"): "ClusterServingRuntime runs no pods by itself: "
                                                    "InferenceServices use it",
    ("serving.kserve.io", "LLMInferenceServiceConfig"): "LLMInferenceServiceConfig runs no pods by itself: "
                                                        "LLMInferenceServices build on it",
}
CLUSTER_SCOPED = {
    "Namespace", "Node", "PersistentVolume", "StorageClass", "PriorityClass", "RuntimeClass", "IngressClass",
    "CustomResourceDefinition", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "APIService", "CSIDriver", "CSINode",
    "ResourceFlavor", "DeviceClass", "ResourceSlice", "GPUInventory", "Queue", "PodSecurityPolicy",
}


def group_of(data: Mapping[str, Any]) -> str | None:
    """The API group of an object ("" for the core group); None when apiVersion is not written."""
    version = data.get("apiVersion")
    if not isinstance(version, str) or not version:
        return None
    return version.split("/", 1)[0] if "/" in version else ""


def _identity(doc: Document) -> tuple[str, str, str | None]:
    data = doc.data
    kind = data.get("kind") if isinstance(data.get("kind"), str) else ""
    metadata = mapping(doc, data.get("metadata"), "metadata", required=False)
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    namespace = metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None
    return str(kind), name, namespace


def display_kind(group: str, kind: str) -> str:
    """The kind as users tell it apart: "Job (batch.volcano.sh)" where a core kind has the same name."""
    if kind in _CORE and group not in _CORE_GROUPS.get(kind, ("apps", "extensions")):
        return f"{kind} ({group})"
    return kind


def is_cluster_scoped(group: str | None, kind: str) -> bool:
    return kind in CLUSTER_SCOPED or (kind.startswith("Cluster") and kind != "ClusterIP")


def pod_templates(doc: Document, ctx: Context | None = None) -> list[Workload] | Skipped:
    """The pod templates a document runs (or why it runs none); raises DocumentError naming the field."""
    ctx = ctx or Context()
    kind, name, namespace = _identity(doc)
    group = group_of(doc.data)
    if group is None:  # no apiVersion written: the one known kind of that name, if there is one
        groups = {g for g, k in (*KINDS, *NESTED) if k == kind}
        if kind in _CORE:
            group = _CORE_GROUPS.get(kind, ("apps",))[0]
        elif len(groups) == 1:
            group = groups.pop()
    cluster_scoped = is_cluster_scoped(group, kind)
    if cluster_scoped and kind != "ClusterWorkflowTemplate":
        namespace = None
    b = Builder(doc, kind, name, namespace, group=group or "")
    known = True
    if (group, kind) in NESTED:
        skipped = NESTED[(group or "", kind)](b, ctx, pod_templates, display_kind)
    elif (group, kind) in KINDS:
        handler, b.family = KINDS[(group or "", kind)]
        if kind == "MPIJob" and str(doc.data.get("apiVersion", "")).endswith("/v2beta1"):
            b.family = labels.MPI_V2
        skipped = handler(b, ctx)
    elif (group, kind) in TEMPLATE_HOLDERS:
        return Skipped(doc.source, kind, name, namespace, TEMPLATE_HOLDERS[(group or "", kind)], cluster_scoped)
    else:
        known = False
        walk(b)
        what = kind or "an object without kind"
        skipped = None if b.found else Skipped(doc.source, kind, name, namespace, f"{what} runs no pods",
                                               cluster_scoped)
    if known and skipped is not None:  # decided elsewhere: its runtime, template or cluster document
        return skipped
    if known or not accelerators.exempt(group, kind):
        _refuse_undecided(b, group or "", known)
    return skipped or b.found


def _refuse_undecided(b: Builder, group: str, known: bool) -> None:
    """An input error for accelerators asked outside every pod check decided (module accelerators)."""
    decided = [w.template_path for w in b.found] + b.consumed
    missed = accelerators.undecided(b.doc.data, decided, loose=not known)
    if not missed:
        return
    shown = ", ".join(f"{accelerators.dotted(path)} ({what})" for path, what in missed[:3])
    shown += f" and {len(missed) - 3} more" if len(missed) > 3 else ""
    kind = display_kind(group, b.kind) or "an object without kind"
    if known:
        why = f"{kind}'s controller puts no such field into a pod"
    else:
        why = (f"{kind} is not a kind check knows, so it cannot build the pods that kind's controller makes; "
               "decide those pods themselves (their manifests, or kubectl get pods -o yaml of running ones)")
    raise b.doc.error(accelerators.dotted(missed[0][0]),
                      f"asks for accelerators that check did not decide: {shown}; {why}")


def context(documents: Iterable[Document | Problem]) -> Context:
    """Runtimes, workflow templates, Ray clusters and ConfigMaps in the input, for the documents that refer to them."""
    ctx = Context()
    for doc in documents:
        if not isinstance(doc, Document):
            continue
        data = doc.data
        group, kind = group_of(data), data.get("kind")
        meta = data.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
        if group == "trainer.kubeflow.org" and kind in trainer.RUNTIME_KINDS:
            ctx.runtimes[(str(kind), "" if kind == "ClusterTrainingRuntime" else namespace, name)] = doc
        elif group == "argoproj.io" and kind in ("WorkflowTemplate", "ClusterWorkflowTemplate"):
            ctx.workflow_templates[(str(kind), "" if kind == "ClusterWorkflowTemplate" else namespace, name)] = doc
        elif group == "ray.io" and kind == "RayCluster":
            ctx.ray_clusters[(namespace, name)] = doc
        elif group == "" and kind == "ConfigMap":  # Katib trial templates
            ctx.config_maps[(namespace, name)] = doc
    return ctx


def workloads(documents: Iterable[Document | Problem]) -> list[Result | ClaimObject]:
    """Every pod template of every document, in order; problems in place of what could not be decided."""
    entries = list(documents)
    ctx = context(entries)
    results: list[Result | ClaimObject] = []
    for doc in entries:
        if isinstance(doc, Problem):
            results.append(doc)
            continue
        if is_claim_object(group_of(doc.data), doc.data.get("kind")):
            kind, name, namespace = _safe_identity(doc)
            results.append(ClaimObject(doc.source, kind, name, namespace, doc.data))
            continue
        try:
            found = pod_templates(doc, ctx)
        except DocumentError as err:
            kind, name, namespace = _safe_identity(doc)
            results.append(Problem(err.source, err.field, err.detail, str(err), kind, name, namespace, doc.index))
            continue
        if isinstance(found, Skipped):
            results.append(found)
        elif not found:  # a known kind whose counts give no template at all
            kind, name, namespace = _safe_identity(doc)
            results.append(Skipped(doc.source, kind, name, namespace, f"{kind} has no pod templates"))
        else:
            results.extend(found)
    return results


def _safe_identity(doc: Document) -> tuple[str, str, str | None]:
    try:
        return _identity(doc)
    except DocumentError:
        kind = doc.data.get("kind")
        return (kind if isinstance(kind, str) else ""), "", None


__all__ = ["Workload", "Skipped", "ClaimObject", "Problem", "Result", "Context", "pod_templates", "workloads",
           "context", "group_of", "is_cluster_scoped", "display_kind"]
