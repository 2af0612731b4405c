"""Kubernetes' own workload kinds and the batch controllers built on them: Kubeflow training jobs, JobSet,
LeaderWorkerSet, Volcano Job. Each reads the pod templates and pod counts where its controller does."""

from __future__ import annotations

import copy
from typing import Any

from webhook.core.podspec import workload as labels
from webhook.manifests import Document

from .model import Builder, Context, Workload, at, count, job_pods, mapping, sequence


def pod(b: Builder, ctx: Context) -> None:
    data = b.doc.data
    mapping(b.doc, data.get("spec"), "spec")
    b.found.append(Workload(b.doc.source, b.kind, b.name, b.namespace, copy.deepcopy(dict(data)), 1))


def replicated(b: Builder, ctx: Context) -> None:
    """Deployment, StatefulSet, ReplicaSet, ReplicationController: spec.replicas (default 1)."""
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    template = spec.get("template")
    mapping(b.doc, template, "spec.template")
    b.template(template, "spec.template", count(b.doc, spec, "replicas", "spec."))


def daemon_set(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    b.template(spec.get("template"), "spec.template", 1, per_node=True)


def job(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    template = mapping(b.doc, spec.get("template"), "spec.template")
    b.template(template, "spec.template", job_pods(b.doc, spec, "spec."), family=labels.JOB)


def cron_job(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    job_template = mapping(b.doc, spec.get("jobTemplate"), "spec.jobTemplate")
    job_spec = mapping(b.doc, job_template.get("spec"), "spec.jobTemplate.spec")
    template = mapping(b.doc, job_spec.get("template"), "spec.jobTemplate.spec.template")
    replicas = job_pods(b.doc, job_spec, "spec.jobTemplate.spec.")
    b.template(template, "spec.jobTemplate.spec.template", replicas, family=labels.JOB)


# Kubeflow training operator: kind -> the field holding its replica specs
REPLICA_SPECS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
    "MXJob": "mxReplicaSpecs",
}


def training(b: Builder, ctx: Context) -> None:
    """spec.<x>ReplicaSpecs.<role>: replicas (default 1) pods of its template, one role after another."""
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    key = REPLICA_SPECS[b.kind]
    roles = mapping(b.doc, spec.get(key), f"spec.{key}")
    if not roles:
        raise b.doc.error(f"spec.{key}", "no replica specs: the job runs no pods")
    elastic = at(spec, "elasticPolicy")
    for role, replica_spec in roles.items():
        path = f"spec.{key}.{role}"
        replica_spec = mapping(b.doc, replica_spec, path)
        notes: tuple[str, ...] = ()
        if isinstance(elastic, dict) and str(role).lower() == "worker":
            bounds = f"{elastic.get('minReplicas', '?')}..{elastic.get('maxReplicas', '?')}"
            notes = (f"elastic ({bounds} workers): decided at the replicas it starts with",)
        b.template(replica_spec.get("template"), f"{path}.template", count(b.doc, replica_spec, "replicas", f"{path}."),
                   str(role), notes=notes)


def job_set(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    replicated_jobs(b, spec, "spec")


def replicated_jobs(b: Builder, spec: Any, path: str, src: Document | None = None, node_pods: int | None = None,
                    trainer: Any = None, note: str = "") -> None:
    """A JobSet spec's replicatedJobs: replicas Jobs of parallelism pods each. For a TrainJob, `src` is the
    runtime (errors name its fields) and the trainer's job (`node`, or the one labelled as the trainer
    step) runs `node_pods` pods with the trainer's overrides."""
    doc = src or b.doc
    jobs = sequence(doc, at(spec, "replicatedJobs"), f"{path}.replicatedJobs")
    if not jobs:
        raise doc.error(f"{path}.replicatedJobs", "no replicated jobs: runs no pods")
    for index, entry in enumerate(jobs):
        at_path = f"{path}.replicatedJobs[{index}]"
        entry = mapping(doc, entry, at_path)
        role = str(entry.get("name") or f"job{index}")
        job_template = mapping(doc, entry.get("template"), f"{at_path}.template")
        job_spec = mapping(doc, job_template.get("spec"), f"{at_path}.template.spec")
        template = mapping(doc, job_spec.get("template"), f"{at_path}.template.spec.template")
        mapping(doc, template.get("spec"), f"{at_path}.template.spec.template.spec")
        jobs_count = count(doc, entry, "replicas", f"{at_path}.")
        per_job = job_pods(doc, job_spec, f"{at_path}.template.spec.")
        notes = (note,) if note else ()
        step = at(job_template, "metadata", "labels", "trainer.kubeflow.org/trainjob-ancestor-step")
        if node_pods is not None and (role == "node" or step == "trainer"):
            per_job, notes = node_pods, (*notes, f"numNodes: {node_pods}")
            template = _trainer_template(template, trainer)
        b.template(template, f"{at_path}.template.spec.template", jobs_count * per_job, role,
                   family=labels.JOBSET, group_size=max(per_job, 1), notes=notes)


def _trainer_template(source: Any, trainer: Any) -> dict[str, Any]:
    """TrainJob's trainer overrides the `node` container (or the first): image, command, args, env, resources."""
    template: dict[str, Any] = copy.deepcopy(dict(source))
    containers = at(template, "spec", "containers")
    if not isinstance(containers, list) or not containers:
        return template
    target = next((c for c in containers if isinstance(c, dict) and c.get("name") == "node"), containers[0])
    if not isinstance(target, dict):
        return template
    if isinstance(trainer, dict):
        for key in ("image", "command", "args"):
            if trainer.get(key) is not None:
                target[key] = copy.deepcopy(trainer[key])
        if isinstance(trainer.get("env"), list):
            names = {e.get("name") for e in trainer["env"] if isinstance(e, dict)}
            kept = [e for e in target.get("env") or [] if not (isinstance(e, dict) and e.get("name") in names)]
            target["env"] = kept + copy.deepcopy(trainer["env"])
        if isinstance(trainer.get("resourcesPerNode"), dict):
            target["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
    return template


def leader_worker_set(b: Builder, ctx: Context) -> None:
    """replicas groups (default 1) of size pods (default 1): one leader and size-1 workers per group."""
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    groups = count(b.doc, spec, "replicas", "spec.")
    lwt = mapping(b.doc, spec.get("leaderWorkerTemplate"), "spec.leaderWorkerTemplate")
    size = count(b.doc, lwt, "size", "spec.leaderWorkerTemplate.")
    base = "spec.leaderWorkerTemplate"
    if lwt.get("leaderTemplate") is None:
        b.template(lwt.get("workerTemplate"), f"{base}.workerTemplate", groups * size, "leader+workers",
                   family=labels.LWS, group_size=max(size, 1),
                   notes=("no leaderTemplate: the workerTemplate serves the leaders too",))
        return
    b.template(lwt.get("leaderTemplate"), f"{base}.leaderTemplate", groups, "leader", family=labels.LWS)
    if size > 1:
        b.template(lwt.get("workerTemplate"), f"{base}.workerTemplate", groups * (size - 1), "worker",
                   family=labels.LWS, group_size=size - 1)
    else:
        mapping(b.doc, lwt.get("workerTemplate"), f"{base}.workerTemplate")


def volcano_job(b: Builder, ctx: Context) -> None:
    """tasks[].replicas pods of tasks[].template; pods get the job's schedulerName (default volcano)."""
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    tasks = sequence(b.doc, spec.get("tasks"), "spec.tasks")
    if not tasks:
        raise b.doc.error("spec.tasks", "no tasks: the job runs no pods")
    scheduler = spec.get("schedulerName") or "volcano"
    for index, task in enumerate(tasks):
        path = f"spec.tasks[{index}]"
        task = mapping(b.doc, task, path)
        role = str(task.get("name") or f"default{index}")  # Volcano's webhook names unnamed tasks so
        replicas = count(b.doc, task, "replicas", f"{path}.", default=0)
        found = b.template(task.get("template"), f"{path}.template", replicas, role, family=labels.VOLCANO)
        pod_spec = found.pod["spec"]
        if isinstance(pod_spec, dict) and not pod_spec.get("schedulerName"):
            pod_spec["schedulerName"] = scheduler
