"""Argo Workflows: each container, script or containerSet template runs as a pod, built as Argo's
controller builds it (argo_pod); a resource template's manifest is decided as the object it creates.
The workflow itself (steps, DAG, loops, conditions) is not evaluated: each template counts once, which
the report notes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from webhook.core.podspec import workload as labels
from webhook.manifests import Document, DocumentError

from . import argo_pod
from .model import Builder, Context, Skipped, Workload, at, mapping, pointer, sequence

_PARAM = re.compile(r"\{\{[^{}]*\}\}")
NOTE = "workflow not evaluated: decided as one pod per template (steps and loops may run it more often)"
FILLED = "Argo parameters filled in with the values the manifest states (a step's arguments may differ)"


def _mains(b: Builder, template: Mapping[str, Any], at_path: str) -> list[Any] | None:
    """The step's containers as Argo names them, or None for a template that runs no pod of its own."""
    if template.get("container") is not None:
        container = dict(mapping(b.doc, template["container"], f"{at_path}.container"))
        return [{**container, "name": "main"}]  # Argo names the template's container "main"
    if template.get("script") is not None:
        script = dict(mapping(b.doc, template["script"], f"{at_path}.script"))
        script.pop("source", None)  # `init` writes it to a file that main runs
        return [{**script, "name": "main", "args": [*(script.get("args") or []), argo_pod.SCRIPT_PATH]}]
    if template.get("containerSet") is not None:
        containers = sequence(b.doc, at(template, "containerSet", "containers"), f"{at_path}.containerSet.containers")
        return [{**c, "name": c.get("name") or "main"} if isinstance(c, Mapping) else c for c in containers]
    return None


def workflow_spec(b: Builder, ctx: Context, spec: Mapping[str, Any], path: str, decide: Any, display: Any) -> None:
    templates = sequence(b.doc, spec.get("templates"), f"{path}.templates")
    for index, template in enumerate(templates):
        at_path = f"{path}.templates[{index}]"
        template = mapping(b.doc, template, at_path)
        role = str(template.get("name") or f"template{index}")
        mains = _mains(b, template, at_path)
        if mains is None:
            if isinstance(template.get("resource"), Mapping):
                _resource(b, ctx, template["resource"], f"{at_path}.resource", role, decide, display)
            continue  # steps, dag, suspend, http, plugin, data: no pod a GPU could reach
        params = argo_pod.parameters(spec, template)
        meta, pod_spec = argo_pod.build(spec, template, mains, f"{b.name}.{role}")
        patches = [(f"{p}.podSpecPatch", t.get("podSpecPatch")) for p, t in ((path, spec), (at_path, template))
                   if t.get("podSpecPatch") is not None]
        patched = argo_pod.apply_patches(b.doc, pod_spec, patches, params)
        filled, filled_meta = argo_pod.fill(patched, params), argo_pod.fill(meta, params)
        used = (filled, filled_meta) != (patched, meta) or any(argo_pod.fill(t, params) != t for _, t in patches)
        b.pod(filled_meta, filled, at_path, 1, role, family=labels.ARGO, notes=(NOTE, FILLED) if used else (NOTE,))


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
