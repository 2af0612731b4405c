"""Kubeflow Katib's Experiment (kubeflow.org): each trial creates the object of `trialTemplate.trialSpec`
(a batch Job, a PyTorchJob, a TrainJob, ...), or the template a ConfigMap holds
(`trialTemplate.configMap`), and `parallelTrialCount` trials (default 3, Katib's
DefaultTrialParallelCount; never more than `maxTrialCount`) run at once.

So the trial object is decided as its own kind, once per trial running at once: each trial is a job of
its own (its own gang), and the namespace's quota must hold all of them together. `${trialParameters.x}`
placeholders stay as written (they fill in arguments, not resources). Katib adds a metrics collector
sidecar to trial pods; it asks for no GPU and is not shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from webhook.manifests import Document, DocumentError

from .model import Builder, Context, Skipped, Workload, at, count, mapping, pointer

DEFAULT_PARALLEL = 3


def _trial_object(b: Builder, ctx: Context, template: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The trial object and the field it came from."""
    if template.get("trialSpec") is not None:
        return mapping(b.doc, template["trialSpec"], "spec.trialTemplate.trialSpec"), "spec.trialTemplate.trialSpec"
    source = mapping(b.doc, template.get("configMap"), "spec.trialTemplate.configMap")
    path = "spec.trialTemplate.configMap"
    name, key = source.get("configMapName"), source.get("templatePath")
    namespace = source.get("configMapNamespace") or b.namespace or ""
    known = ctx.config_maps.get((str(namespace), str(name)))
    if known is None:  # namespace left to -n on both sides
        known = next((d for (_, n), d in ctx.config_maps.items() if n == name and not source.get("configMapNamespace")),
                     None)
    if known is None:
        raise b.doc.error(path, f"cannot decide: the trial template is in ConfigMap {name}, which is not in the "
                          f"input; pass that ConfigMap too (its data key {key} holds the trial's manifest)")
    text = at(known.data, "data", str(key))
    if not isinstance(text, str):
        raise b.doc.error(path, f"cannot decide: ConfigMap {name} [{known.source}] has no data key {key}")
    try:
        trial = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise b.doc.error(path, f"cannot decide: ConfigMap {name} data {key}: invalid YAML "
                          f"({str(err).splitlines()[0]})") from None
    return mapping(b.doc, trial, path), path


def experiment(b: Builder, ctx: Context, decide: Any, display: Any) -> Skipped | None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    template = mapping(b.doc, spec.get("trialTemplate"), "spec.trialTemplate")
    trial, path = _trial_object(b, ctx, template)
    trials = count(b.doc, spec, "parallelTrialCount", "spec.", default=DEFAULT_PARALLEL)
    if spec.get("maxTrialCount") is not None:
        trials = min(trials, count(b.doc, spec, "maxTrialCount", "spec."))
    trials = max(trials, 1)
    kind = str(trial.get("kind") or "")
    meta = dict(trial.get("metadata") or {}) if isinstance(trial.get("metadata"), Mapping) else {}
    base = f"{b.name}-trial"
    meta.setdefault("name", base)
    if b.namespace:
        meta.setdefault("namespace", b.namespace)
    inner = Document(b.doc.file, b.doc.index, {**trial, "metadata": meta}, b.doc.item)
    try:
        result = decide(inner, ctx)
    except DocumentError as err:
        raise b.doc.error(f"{path}.{err.field}".rstrip("."), err.detail) from None
    if isinstance(result, Skipped):
        raise b.doc.error(path, f"the trial's {kind or 'object'} runs no pods: {result.reason}")
    version = str(trial.get("apiVersion") or "")
    shown = display(version.split("/", 1)[0] if "/" in version else "", kind)
    note = (f"parallelTrialCount: {trials} trials run at once, each its own {shown}; quota must hold them all"
            if trials > 1 else f"parallelTrialCount: 1 trial at a time, its own {shown}")
    for number in range(trials):
        for found in result:
            assert isinstance(found, Workload)
            role = f"trial {number + 1}/{trials}: {display(found.group, kind)}" + (f" {found.role}" if found.role
                                                                                    else "")
            b.found.append(Workload(
                b.doc.source, b.kind, b.name, found.namespace, found.pod, found.replicas, found.per_node,
                pointer(path) + found.template_path, role, (*found.notes, note), found.walked, found.family,
                found.group_size, (kind, f"{base}-{number}"), found.group,
            ))
    return None


__all__ = ["experiment", "DEFAULT_PARALLEL"]
