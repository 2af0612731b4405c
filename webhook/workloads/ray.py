"""KubeRay: RayCluster, and the clusters RayJob (spec.rayClusterSpec) and RayService (spec.rayClusterConfig) make.

One head pod, and per worker group replicas x numOfHosts pods; with the in-tree autoscaler on, a group
starts at minReplicas, so that is what is decided (with a note)."""

from __future__ import annotations

from typing import Any

from webhook.core.podspec import workload as labels

from .model import Builder, Context, Skipped, at, count, mapping, sequence


def cluster_spec(b: Builder, spec: Any, path: str) -> None:
    spec = mapping(b.doc, spec, path)
    autoscaling = spec.get("enableInTreeAutoscaling") is True
    head = mapping(b.doc, spec.get("headGroupSpec"), f"{path}.headGroupSpec")
    b.template(head.get("template"), f"{path}.headGroupSpec.template", 1, "head", family=labels.RAY)
    groups = sequence(b.doc, spec.get("workerGroupSpecs"), f"{path}.workerGroupSpecs", required=False)
    for index, group in enumerate(groups):
        group_path = f"{path}.workerGroupSpecs[{index}]"
        group = mapping(b.doc, group, group_path)
        role = str(group.get("groupName") or f"group{index}")
        hosts = count(b.doc, group, "numOfHosts", f"{group_path}.")
        notes: list[str] = []
        if group.get("suspend") is True:
            notes.append("suspended: decided as if it ran")
        if autoscaling:
            workers = count(b.doc, group, "minReplicas", f"{group_path}.", default=0)
            notes.append(f"autoscaled: decided at minReplicas {workers}"
                         + (f" (up to maxReplicas {group['maxReplicas']})" if "maxReplicas" in group else ""))
        else:  # KubeRay keeps replicas within minReplicas..maxReplicas
            workers = count(b.doc, group, "replicas", f"{group_path}.", default=0)
            low = count(b.doc, group, "minReplicas", f"{group_path}.", default=0)
            high = count(b.doc, group, "maxReplicas", f"{group_path}.", default=2**31 - 1)
            workers = min(max(workers, low), high)
        if hosts > 1:
            notes.append(f"numOfHosts {hosts}: {hosts} pods per replica")
        b.template(group.get("template"), f"{group_path}.template", workers * hosts, role, family=labels.RAY,
                   notes=tuple(notes))


def ray_cluster(b: Builder, ctx: Context) -> None:
    cluster_spec(b, b.doc.data.get("spec"), "spec")


def ray_service(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    cluster_spec(b, spec.get("rayClusterConfig"), "spec.rayClusterConfig")


def ray_job(b: Builder, ctx: Context) -> Skipped | None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    if spec.get("rayClusterSpec") is None and isinstance(spec.get("clusterSelector"), dict):
        # Runs on a cluster that exists already: its pods are that RayCluster's, decided where it is declared.
        target = at(spec, "clusterSelector", labels.RAY_CLUSTER)
        known = ctx.ray_clusters.get((b.namespace or "", str(target)))
        if known is not None:
            return Skipped(b.doc.source, b.kind, b.name, b.namespace,
                           f"runs on RayCluster {target}, decided as its own document [{known.source}]")
        raise b.doc.error("spec.clusterSelector",
                          f"cannot decide: runs on an existing RayCluster ({target or 'selected by labels'}) "
                          "that is not in the input; pass its manifest too (pod templates in its "
                          "spec.headGroupSpec and spec.workerGroupSpecs)")
    cluster_spec(b, spec.get("rayClusterSpec"), "spec.rayClusterSpec")
    submitter = spec.get("submitterPodTemplate")
    if submitter is not None and spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
        b.template(submitter, "spec.submitterPodTemplate", 1, "submitter", family=labels.JOB)
    return None
