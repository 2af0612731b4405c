"""An UPDATE of pods/ephemeralcontainers (`kubectl debug`): the containers it adds are held to the isolation
rules (no variable of the limit layer, no GPU resources, not privileged on a GPU node, envFrom screened)
and get NVIDIA_VISIBLE_DEVICES=void (`neutralise.py`): an ephemeral container never has a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied
from webhook.core.domain.model import Snapshot
from webhook.core.domain.refusal import Refusal
from webhook.core.podspec.coerce import list_of, mapping_of
from webhook.core.podspec.envvars import is_bypass_entry
from webhook.core.podspec.fastpath import is_gpu_pod
from webhook.core.podspec.limits import GPU_POD_ONLY_ENV, NO_DEVICES
from webhook.core.podspec.podshape import shape_error
from webhook.core.podspec.vendor_table import is_gpu_resource
from webhook.core.policy.model import Policy

from .envfrom import containers, env_from
from .neutralise import VISIBLE, lacking, no_gpu_allowed, no_gpu_denied, void_ops
from .scope import is_managed


def ephemeral(pod: Mapping[str, Any], old: Mapping[str, Any] | None, snapshot: Snapshot, policy: Policy, *,
              namespace: str | None = None, mutating: bool) -> Decision:
    """An UPDATE of pods/ephemeralcontainers (`kubectl debug`): the containers it adds are held to the
    isolation rules, and get NVIDIA_VISIBLE_DEVICES=void (an ephemeral container never has a GPU)."""
    malformed = shape_error(pod)
    if malformed:
        return denied(422, "invalid-pod", malformed, gpu_pod=False)
    metadata = mapping_of(pod.get("metadata"))
    namespace = namespace or str(metadata.get("namespace") or "default")
    if not is_managed(namespace, snapshot, policy):
        return allowed("not-managed", f"namespace {namespace} is not managed", managed=False, gpu_pod=False)
    spec = mapping_of(pod.get("spec"))
    before = {str(mapping_of(c).get("name")) for c in list_of(mapping_of(mapping_of(old).get("spec"))
                                                              .get("ephemeralContainers"))}
    added = [(key, index, where, c) for key, index, where, c in containers(spec, ("ephemeralContainers",))
             if not c.get("name") or str(c.get("name")) not in before]
    if not added:
        return no_gpu_allowed("no-new-ephemeral")
    gpu_pod = is_gpu_pod(pod)
    node_name = spec.get("nodeName")
    node = snapshot.nodes.get(node_name) if isinstance(node_name, str) else None
    on_gpu_node = gpu_pod or node is None or bool(node.gpus)
    problems = _problems(added, gpu_pod, on_gpu_node)
    found, unresolved = env_from({"ephemeralContainers": [c for _, _, _, c in added]}, namespace, snapshot,
                                 gpu_pod, ("ephemeralContainers",))
    problems += found
    # An ephemeral container never has a GPU: the NVIDIA_VISIBLE_DEVICES=void it gets is an explicit entry,
    # which wins over the source, so `neutralise` and `warn` admit it; `deny` refuses.
    if unresolved and policy.unresolved_env_from == "deny":
        problems.append(Refusal("isolation-env-from", 403,
                                f"{unresolved[0].describe()} through envFrom, which the webhook cannot read "
                                "(policy isolation.unresolvedEnvFrom: deny)"))
    if problems:
        return no_gpu_denied(problems[0].code, problems[0].rule, "; ".join(p.message for p in problems))
    targets = [(key, index) for key, index, _, _ in added]
    if mutating:
        return no_gpu_allowed("ephemeral", f"{VISIBLE}={NO_DEVICES}", void_ops(pod, targets))
    missing = lacking(pod, targets) if on_gpu_node else []
    if missing:
        return no_gpu_denied(403, "gpu-reachable", f"{missing[0]} lacks {VISIBLE}={NO_DEVICES} that the mutating "
                                                   "webhook writes into ephemeral containers on GPU nodes: retry, or "
                                                   "set it yourself")
    return no_gpu_allowed("ephemeral")


def _problems(added: list[tuple[str, int, str, Mapping[str, Any]]], gpu_pod: bool, on_gpu_node: bool
              ) -> list[Refusal]:
    """What the added containers set or ask for themselves that they must not (envFrom aside)."""
    problems: list[Refusal] = []
    for _, _, where, container in added:
        for entry in list_of(container.get("env")):
            name = mapping_of(entry).get("name")
            if is_bypass_entry(entry) or (name in GPU_POD_ONLY_ENV and gpu_pod):
                problems.append(Refusal("isolation-env", 403,
                                        f"{where} sets {name} itself, which bypasses GPU isolation; remove it"))
        resources = mapping_of(container.get("resources"))
        if any(isinstance(r, str) and is_gpu_resource(r) for part in resources.values() for r in mapping_of(part)):
            problems.append(Refusal("ephemeral-resources", 422,
                                    f"{where} asks for GPUs; ephemeral containers cannot have resources"))
        if on_gpu_node and mapping_of(container.get("securityContext")).get("privileged") is True:
            problems.append(Refusal("isolation-privileged", 403,
                                    f"{where} is privileged on a GPU node, which exposes every GPU of the node; "
                                    "set securityContext.privileged: false"))
    return problems
