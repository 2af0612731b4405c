"""Argo Workflows: each container, script or containerSet template runs as a pod; a resource template's
manifest is decided as the object it creates. The workflow itself (steps, DAG, loops, conditions) is not
evaluated: each template counts once, which the report notes."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import yaml

from webhook.core.podspec import workload as labels
from webhook.manifests import Document, DocumentError

from .model import Builder, Context, Skipped, Workload, at, mapping, pointer, sequence

_PARAM = re.compile(r"\{\{[^{}]*\}\}")
NOTE = "workflow not evaluated: decided as one pod per template (steps and loops may run it more often)"
# Pod fields a template sets for its own pod, else the workflow's spec sets for every pod
_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "schedulerName", "priorityClassName", "securityContext",
               "serviceAccountName", "hostNetwork", "runtimeClassName", "imagePullSecrets", "dnsPolicy")


def _pod(workflow: Mapping[str, Any], template: Mapping[str, Any], containers: list[Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers, "restartPolicy": "Never"}
    for key in _POD_FIELDS:
        value = template.get(key, workflow.get(key))
        if value is not None:
            spec[key] = copy.deepcopy(value)
    if template.get("initContainers"):
        spec["initContainers"] = copy.deepcopy(template["initContainers"])
    volumes = [*(workflow.get("volumes") or []), *(template.get("volumes") or [])]
    if volumes:
        spec["volumes"] = copy.deepcopy(volumes)
    return spec


def _metadata(workflow: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for source in (workflow.get("podMetadata"), template.get("metadata")):
        if isinstance(source, Mapping):
            for key in ("labels", "annotations"):
                if isinstance(source.get(key), Mapping):
                    meta.setdefault(key, {}).update(source[key])
    return meta


def workflow_spec(b: Builder, ctx: Context, spec: Mapping[str, Any], path: str, decide: Any, display: Any) -> None:
    templates = sequence(b.doc, spec.get("templates"), f"{path}.templates")
    for index, template in enumerate(templates):
        at_path = f"{path}.templates[{index}]"
        template = mapping(b.doc, template, at_path)
        role = str(template.get("name") or f"template{index}")
        containers: list[Any] = []
        if template.get("container") is not None:
            container = dict(mapping(b.doc, template["container"], f"{at_path}.container"))
            containers = [{**container, "name": "main"}]  # Argo names the template's container "main"
        elif template.get("script") is not None:
            script = dict(mapping(b.doc, template["script"], f"{at_path}.script"))
            script.pop("source", None)
            containers = [{**script, "name": "main"}]
        elif template.get("containerSet") is not None:
            containers = list(sequence(b.doc, at(template, "containerSet", "containers"),
                                       f"{at_path}.containerSet.containers"))
        elif isinstance(template.get("resource"), Mapping):
            _resource(b, ctx, template["resource"], f"{at_path}.resource", role, decide, display)
            continue
        else:
            continue  # steps, dag, suspend, http, plugin: run no pod of their own
        containers += list(template.get("sidecars") or [])
        b.pod(_metadata(spec, template), _pod(spec, template, containers), at_path, 1, role,
              family=labels.ARGO, notes=(NOTE,))


def _resource(b: Builder, ctx: Context, resource: Mapping[str, Any], path: str, role: str, decide: Any,
              display: Any) -> None:
    """A resource template that creates an object: decided as that object, roles prefixed by the template."""
    manifest = resource.get("manifest")
    if resource.get("action", "create") not in ("create", "apply") or not isinstance(manifest, str):
        return
    params = _PARAM.findall(manifest)
    try:
        # Argo fills {{...}} in before creating the object; a placeholder stands in for each.
        embedded = yaml.safe_load(_PARAM.sub("argo-parameter", manifest))
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise b.doc.error(f"{path}.manifest", f"cannot decide the object it creates: invalid YAML: {problem}") from None
    if not isinstance(embedded, Mapping):
        return
    inner = Document(b.doc.file, b.doc.index, embedded, b.doc.item)
    try:
        result = decide(inner, ctx)
    except DocumentError as err:
        raise b.doc.error(f"{path}.manifest.{err.field}".rstrip("."), err.detail) from None
    if isinstance(result, Skipped):
        return
    kind = embedded.get("kind")
    name = at(embedded, "metadata", "name") or at(embedded, "metadata", "generateName") or ""
    for found in result:
        assert isinstance(found, Workload)
        inner_role = f"{display(found.group, str(kind))} {name}" + (f" {found.role}" if found.role else "")
        b.found.append(Workload(
            b.doc.source, b.kind, b.name, b.namespace if found.namespace is None else found.namespace, found.pod,
            found.replicas, found.per_node, pointer(f"{path}.manifest") + found.template_path, f"{role}: {inner_role}",
            (*found.notes, f"created by the workflow's resource template {role}",
             *(["Argo parameters in its manifest replaced by placeholders"] if params else [])),
            found.walked, found.family, found.group_size, found.owner or (str(kind), str(name)),
        ))


def workflow(b: Builder, ctx: Context, decide: Any, display: Any) -> Skipped | None:
    data = b.doc.data
    spec = mapping(b.doc, data.get("spec"), "spec")
    path = "spec"
    if b.kind == "CronWorkflow":
        spec, path = mapping(b.doc, spec.get("workflowSpec"), "spec.workflowSpec"), "spec.workflowSpec"
    ref = spec.get("workflowTemplateRef")
    if isinstance(ref, Mapping) and not spec.get("templates"):
        kind = "ClusterWorkflowTemplate" if ref.get("clusterScope") else "WorkflowTemplate"
        namespace = "" if kind == "ClusterWorkflowTemplate" else (b.namespace or "")
        known = ctx.workflow_templates.get((kind, namespace, str(ref.get("name"))))
        if known is not None:
            return Skipped(b.doc.source, b.kind, b.name, b.namespace,
                           f"runs {kind} {ref.get('name')}, decided as its own document [{known.source}]")
        raise b.doc.error(f"{path}.workflowTemplateRef",
                          f"cannot decide: its pods come from {kind} {ref.get('name')}, which is not in the "
                          "input; pass that template's manifest too (pod templates in its spec.templates)")
    workflow_spec(b, ctx, spec, path, decide, display)
    if not b.found:
        return Skipped(b.doc.source, b.kind, b.name, b.namespace,
                       "no container, script, containerSet or resource template: runs no pods")
    return None
