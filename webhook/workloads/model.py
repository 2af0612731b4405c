"""What a document yields for admission: the pods of each of its pod templates, or why it yields none."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.manifests import Document, Problem


@dataclass(frozen=True)
class Workload:
    """One pod template of a workload, ready for admission, and how many pods of it run at once."""

    source: str
    kind: str
    name: str
    namespace: str | None  # None: not set in the manifest (the caller's default applies)
    pod: Mapping[str, Any]
    replicas: int
    per_node: bool = False  # DaemonSet: one pod on every eligible node; `replicas` is 1
    template_path: str = ""  # JSON pointer of the pod template inside the workload ("" for a Pod)
    role: str = ""  # the template's role in the workload: "Worker", "head", "leader", ...; "" for one-template kinds
    notes: tuple[str, ...] = ()  # how the count was reached when it is not the plain one
    walked: bool = False  # found by walking an unknown kind, not by the kind's own fields
    family: str = ""  # controller family (webhook.core.podspec.workload) whose labels the pods carry
    group_size: int = 1  # pods per group (LeaderWorkerSet workers, JobSet pods per Job), for their labels
    owner: tuple[str, str] | None = None  # (kind, name) of the object whose controller makes the pods, if not this
    group: str = ""  # API group of the workload ("" for the core group)

    @property
    def controller(self) -> tuple[str, str]:
        return self.owner or (self.kind, self.name)


@dataclass(frozen=True)
class Skipped:
    """A document that runs no pod (Service, ConfigMap, ...), listed so the report accounts for it."""

    source: str
    kind: str
    name: str
    namespace: str | None
    reason: str
    cluster_scoped: bool = False


Result = Workload | Skipped | Problem


@dataclass
class Context:
    """What one document may need from the others in the same input: runtimes, templates, clusters."""

    runtimes: dict[tuple[str, str, str], Document] = field(default_factory=dict)  # (kind, namespace, name)
    workflow_templates: dict[tuple[str, str, str], Document] = field(default_factory=dict)
    ray_clusters: dict[tuple[str, str], Document] = field(default_factory=dict)
    config_maps: dict[tuple[str, str], Document] = field(default_factory=dict)  # (namespace, name)


def kind_of(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "a mapping"}
    return names.get(type(value), type(value).__name__)


def mapping(doc: Document, value: Any, path: str, required: bool = True) -> Mapping[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise doc.error(path, "missing" if value is None else f"expected a mapping, got {kind_of(value)}")
    return value


def sequence(doc: Document, value: Any, path: str, required: bool = True) -> Sequence[Any]:
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise doc.error(path, "missing" if value is None else f"expected a list, got {kind_of(value)}")
    return value


def count(doc: Document, spec: Mapping[str, Any], key: str, prefix: str, default: int = 1) -> int:
    value = spec.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise doc.error(f"{prefix}{key}", f"expected a whole number >= 0, got {value!r}")
    return value


def at(node: Any, *keys: str) -> Any:
    """node[k1][k2]..., or None where a step is missing or not a mapping."""
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def job_pods(doc: Document, job_spec: Mapping[str, Any], prefix: str) -> int:
    """Pods a batch/v1 Job runs at once: parallelism (default 1), never more than completions."""
    parallel = count(doc, job_spec, "parallelism", prefix)
    if job_spec.get("completions") is not None:
        return min(parallel, count(doc, job_spec, "completions", prefix))
    return parallel


def pointer(path: str) -> str:
    """"spec.a.b[2].template" -> "/spec/a/b/2/template"."""
    return "".join(f"/{part}" for part in path.replace("[", ".").replace("]", "").split(".") if part)


@dataclass
class Builder:
    """Collects the pod templates of one document, each as a Workload sharing the document's identity."""

    doc: Document
    kind: str
    name: str
    namespace: str | None
    family: str = ""
    group: str = ""
    found: list[Workload] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)  # pointers of fields read into pods besides templates

    def template(self, value: Any, path: str, replicas: int, role: str = "", **extra: Any) -> Workload:
        """Add the pod template at `path` (a {metadata, spec} mapping) with its pod count."""
        template = mapping(self.doc, value, path)
        spec = mapping(self.doc, template.get("spec"), f"{path}.spec")
        meta = mapping(self.doc, template.get("metadata"), f"{path}.metadata", required=False)
        return self.pod(meta, spec, path, replicas, role, **extra)

    def pod(self, meta: Mapping[str, Any], spec: Mapping[str, Any], path: str, replicas: int, role: str = "",
            **extra: Any) -> Workload:
        """Add a pod made of `meta` and `spec` (already built or checked by the caller)."""
        pod_meta = copy.deepcopy(dict(meta))
        if not pod_meta.get("name") and not pod_meta.get("generateName"):
            source = self.doc.data.get("metadata")
            if isinstance(source, Mapping) and source.get("name"):
                pod_meta["name"] = source["name"]
            elif isinstance(source, Mapping) and source.get("generateName"):
                pod_meta["generateName"] = source["generateName"]
        if self.namespace and not pod_meta.get("namespace"):
            pod_meta["namespace"] = self.namespace
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": copy.deepcopy(dict(spec))}
        extra.setdefault("family", self.family)
        extra.setdefault("group", self.group)
        workload = Workload(self.doc.source, self.kind, self.name, self.namespace, pod, replicas,
                            template_path=pointer(path), role=role, **extra)
        self.found.append(workload)
        return workload


__all__ = ["Workload", "Skipped", "Problem", "Result", "Context", "Builder", "mapping", "sequence", "count", "at",
           "job_pods", "pointer", "kind_of"]
