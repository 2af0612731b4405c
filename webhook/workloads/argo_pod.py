"""The pod Argo's workflow controller creates for a container, script or containerSet template.

As `createWorkflowPod` in argo-workflows `workflow/controller/workflowpod.go` builds it: init containers
`init` (the executor, which stages artifacts and scripts) then the template's own; containers `wait`
(the executor, first on purpose: the kubelet starts containers in order and `wait` must see `main`
start), then the step's container renamed `main` (a containerSet keeps its containers' names), then the
template's sidecars; annotations `workflows.argoproj.io/node-name` and
`kubectl.kubernetes.io/default-container` (main). Pod fields a template sets win over the workflow's.
The workflow's and the template's `podSpecPatch` are applied last, as Argo applies them.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

from webhook.manifests import Document

EXECUTOR_IMAGE = "quay.io/argoproj/argoexec"  # the controller's --executor-image
NODE_NAME = "workflows.argoproj.io/node-name"
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
COMPLETED = "workflows.argoproj.io/completed"
SCRIPT_PATH = "/argo/staging/script"  # where `init` writes a script template's source; main runs it
_VAR_RUN_ARGO = "var-run-argo"
# Pod fields a template sets for its own pod, else the workflow's spec sets for every pod
POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "schedulerName", "priorityClassName", "securityContext",
              "serviceAccountName", "hostNetwork", "runtimeClassName", "imagePullSecrets", "dnsPolicy")
_PARAM = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
# Lists that a strategic merge patch merges item by item on this key (the rest are replaced)
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name", "volumes": "name",
               "env": "name", "volumeMounts": "mountPath", "ports": "containerPort"}


def _executor(name: str) -> dict[str, Any]:
    return {"name": name, "image": EXECUTOR_IMAGE, "command": ["argoexec", name],
            "volumeMounts": [{"name": _VAR_RUN_ARGO, "mountPath": "/var/run/argo"}]}


def _with_argo(container: Mapping[str, Any]) -> dict[str, Any]:
    """A user container as Argo runs it: ARGO_CONTAINER_NAME set, /var/run/argo mounted."""
    out = copy.deepcopy(dict(container))
    out["env"] = [*(out.get("env") or []), {"name": "ARGO_CONTAINER_NAME", "value": str(out.get("name", ""))}]
    out["volumeMounts"] = [*(out.get("volumeMounts") or []), {"name": _VAR_RUN_ARGO, "mountPath": "/var/run/argo"}]
    return out


def build(workflow: Mapping[str, Any], template: Mapping[str, Any], mains: list[Any],
          node: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, spec) of the pod for `template` whose step containers are `mains`."""
    containers = [_executor("wait"), *(_with_argo(c) for c in mains),
                  *(_with_argo(c) for c in template.get("sidecars") or [])]
    spec: dict[str, Any] = {
        "initContainers": [_executor("init"), *(_with_argo(c) for c in template.get("initContainers") or [])],
        "containers": containers,
        "restartPolicy": "Never",
    }
    for key in POD_FIELDS:
        value = template.get(key, workflow.get(key))
        if value is not None:
            spec[key] = copy.deepcopy(value)
    spec["volumes"] = copy.deepcopy([*(workflow.get("volumes") or []), *(template.get("volumes") or []),
                                     {"name": _VAR_RUN_ARGO, "emptyDir": {}}])
    names = [c.get("name") for c in containers if isinstance(c, Mapping)]
    meta: dict[str, Any] = {"labels": {COMPLETED: "false"},
                            "annotations": {NODE_NAME: node,
                                            DEFAULT_CONTAINER: "main" if "main" in names else str(names[-1])}}
    for source in (workflow.get("podMetadata"), template.get("metadata")):
        if isinstance(source, Mapping):
            for key in ("labels", "annotations"):
                if isinstance(source.get(key), Mapping):
                    meta[key].update(source[key])
    return meta, spec


def parameters(workflow: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, str]:
    """The parameter values Argo fills `{{...}}` with that the manifest itself states: the workflow's
    arguments and the template's inputs (value, else default). A caller's arguments may differ."""
    found: dict[str, str] = {}
    for prefix, params in (("workflow.parameters.", (workflow.get("arguments") or {}).get("parameters")),
                           ("inputs.parameters.", (template.get("inputs") or {}).get("parameters"))):
        for param in params if isinstance(params, list) else []:
            if isinstance(param, Mapping) and isinstance(param.get("name"), str):
                value = param.get("value", param.get("default"))
                if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    found[prefix + param["name"]] = str(value)
    return found


def fill(value: Any, params: Mapping[str, str]) -> Any:
    """`value` with each `{{name}}` of a known parameter replaced by its value; the others kept."""
    if isinstance(value, str):
        return _PARAM.sub(lambda m: params.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [fill(v, params) for v in value]
    if isinstance(value, Mapping):
        return {k: fill(v, params) for k, v in value.items()}
    return value


def merge(base: Any, patch: Any, key: str = "") -> Any:
    """`patch` applied to `base` as a strategic merge patch on a pod spec: mappings merged (a null
    deletes), the lists of _MERGE_KEYS merged item by item, other lists replaced."""
    if isinstance(base, Mapping) and isinstance(patch, Mapping):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(out.get(k), v, str(k))
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in _MERGE_KEYS:
        on = _MERGE_KEYS[key]
        out_list = list(base)
        for item in patch:
            at = next((i for i, b in enumerate(out_list)
                       if isinstance(b, Mapping) and isinstance(item, Mapping) and b.get(on) == item.get(on)), None)
            if at is None:
                out_list.append(item)
            else:
                out_list[at] = merge(out_list[at], item)
        return out_list
    return copy.deepcopy(patch)


def apply_patches(doc: Document, spec: dict[str, Any], patches: list[tuple[str, Any]],
                  params: Mapping[str, str]) -> dict[str, Any]:
    """`spec` with each (field path, podSpecPatch) applied in order (the workflow's, then the template's)."""
    for path, text in patches:
        if not isinstance(text, str):
            raise doc.error(path, f"expected a string of JSON or YAML, got {type(text).__name__}")
        filled = fill(text, params)
        try:
            patch = yaml.safe_load(filled)  # JSON is YAML too
        except yaml.YAMLError as err:
            raise doc.error(path, f"cannot apply it: invalid JSON or YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(patch, Mapping):
            raise doc.error(path, "cannot apply it: not a mapping of pod spec fields")
        left = _PARAM.search(json.dumps(patch))
        if left:
            raise doc.error(path, f"cannot apply it: {{{{{left.group(1)}}}}} is a parameter the manifest gives no "
                            "value for; check decides the pod Argo creates after filling it in")
        spec = merge(spec, patch)
    return spec


__all__ = ["build", "parameters", "fill", "merge", "apply_patches", "EXECUTOR_IMAGE", "NODE_NAME", "POD_FIELDS"]
