"""Kubeflow Trainer v2: a TrainJob runs the JobSet of the (Cluster)TrainingRuntime it names, with the
trainer's numNodes, resourcesPerNode, image, command, args and env applied to the trainer's job."""

from __future__ import annotations

from .kinds import replicated_jobs
from .model import Builder, Context, Skipped, count, mapping

RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")


def train_job(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    ref = mapping(b.doc, spec.get("runtimeRef"), "spec.runtimeRef")
    runtime_name = ref.get("name")
    if not isinstance(runtime_name, str) or not runtime_name:
        raise b.doc.error("spec.runtimeRef.name", "missing: the runtime holds the pod templates")
    runtime_kind = ref.get("kind") or "ClusterTrainingRuntime"
    namespace = "" if runtime_kind == "ClusterTrainingRuntime" else (b.namespace or "")
    runtime = ctx.runtimes.get((str(runtime_kind), namespace, runtime_name))
    if runtime is None and runtime_kind == "TrainingRuntime":  # namespace left to -n on both sides
        runtime = next((d for (k, _, n), d in ctx.runtimes.items() if k == runtime_kind and n == runtime_name), None)
    if runtime is None:
        raise b.doc.error(
            "spec.runtimeRef",
            f"cannot decide: its pods come from {runtime_kind} {runtime_name}, which is not in the input; "
            f"pass that runtime's manifest too (its pod templates are in spec.template.spec.replicatedJobs)",
        )
    trainer = mapping(b.doc, spec.get("trainer"), "spec.trainer", required=False)
    b.consumed.append("/spec/trainer")  # resourcesPerNode goes into the trainer's container
    runtime_spec = mapping(runtime, runtime.data.get("spec"), "spec")
    template = mapping(runtime, runtime_spec.get("template"), "spec.template")
    if trainer.get("numNodes") is not None:
        nodes = count(b.doc, trainer, "numNodes", "spec.trainer.")
    else:
        nodes = count(runtime, mapping(runtime, runtime_spec.get("mlPolicy"), "spec.mlPolicy", required=False),
                      "numNodes", "spec.mlPolicy.")
    # Errors inside the runtime name the runtime's file and fields, where they must be fixed.
    replicated_jobs(b, mapping(runtime, template.get("spec"), "spec.template.spec"), "spec.template.spec",
                    runtime, nodes, trainer, f"pod template from {runtime_kind} {runtime_name} [{runtime.source}]")


def runtime(b: Builder, ctx: Context) -> Skipped:
    return Skipped(b.doc.source, b.kind, b.name, b.namespace,
                   f"{b.kind} runs no pods by itself: its templates are decided with the TrainJobs that name it",
                   cluster_scoped=b.kind.startswith("Cluster"))


__all__ = ["train_job", "runtime", "RUNTIME_KINDS"]
