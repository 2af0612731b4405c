"""An UPDATE of pods/ephemeralcontainers (`kubectl debug`): the containers it adds are held to the isolation
rules (no variable of the limit layer, no GPU resources, not privileged on a GPU node, envFrom screened)
and get NVIDIA_VISIBLE_DEVICES=void (`neutralise.py`): an ephemeral container never has a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied
from webhook.core.domain.model import Snapshot
from webhook.core.domain.podview import ContainerView
from webhook.core.domain.refusal import Refusal
from webhook.core.podspec.envvars import is_bypass_entry
from webhook.core.podspec.fastpath import is_gpu_pod
from webhook.core.podspec.limits import GPU_POD_ONLY_ENV, NO_DEVICES
from webhook.core.podspec.podshape import read_pod
from webhook.core.podspec.vendor_table import is_gpu_resource
from webhook.core.podspec.view import view_of
from webhook.core.policy.model import Policy

from .envfrom import env_from, named
from .neutralise import VISIBLE, lacking, no_gpu_allowed, no_gpu_denied, void_ops
from .scope import is_managed


def ephemeral(pod: Mapping[str, Any], old: Mapping[str, Any] | None, snapshot: Snapshot, policy: Policy, *,
              namespace: str | None = None, mutating: bool) -> Decision:
    """An UPDATE of pods/ephemeralcontainers (`kubectl debug`): the containers it adds are held to the
    isolation rules, and get NVIDIA_VISIBLE_DEVICES=void (an ephemeral container never has a GPU)."""
    view = read_pod(pod)
    if isinstance(view, str):
        return denied(422, "invalid-pod", view, gpu_pod=False)
    namespace = namespace or view.namespace or "default"
    if not is_managed(namespace, snapshot, policy):
        return allowed("not-managed", f"namespace {namespace} is not managed", managed=False, gpu_pod=False)
    before = {c.name for c in view_of(old).ephemeral} if isinstance(old, Mapping) else set()
    added = tuple(c for c in view.ephemeral if not c.name or c.name not in before)
    if not added:
        return no_gpu_allowed("no-new-ephemeral")
    gpu_pod = is_gpu_pod(pod)  # the fast path's test, as for a pod created
    node = snapshot.nodes.get(view.node_name) if view.node_name else None
    on_gpu_node = gpu_pod or node is None or bool(node.gpus)
    problems = _problems(added, gpu_pod, on_gpu_node)
    found, unresolved = env_from(replace(view, containers=added), namespace, snapshot, gpu_pod,
                                 ("ephemeralContainers",))
    problems += found
    # An ephemeral container never has a GPU: the NVIDIA_VISIBLE_DEVICES=void it gets is an explicit entry,
    # which wins over the source, so `neutralise` and `warn` admit it; `deny` refuses.
    if unresolved and policy.unresolved_env_from == "deny":
        problems.append(Refusal("isolation-env-from", 403,
                                f"{unresolved[0].describe()} through envFrom, which the webhook cannot read "
                                "(policy isolation.unresolvedEnvFrom: deny)"))
    if problems:
        return no_gpu_denied(problems[0].code, problems[0].rule, "; ".join(p.message for p in problems))
    targets = [(c.kind, c.index) for c in added]
    if mutating:
        return no_gpu_allowed("ephemeral", f"{VISIBLE}={NO_DEVICES}", void_ops(view, targets))
    missing = lacking(view, targets) if on_gpu_node else []
    if missing:
        return no_gpu_denied(403, "gpu-reachable", f"{missing[0]} lacks {VISIBLE}={NO_DEVICES} that the mutating "
                                                   "webhook writes into ephemeral containers on GPU nodes: retry, or "
                                                   "set it yourself")
    return no_gpu_allowed("ephemeral")


def _problems(added: tuple[ContainerView, ...], gpu_pod: bool, on_gpu_node: bool) -> list[Refusal]:
    """What the added containers set or ask for themselves that they must not (envFrom aside)."""
    problems: list[Refusal] = []
    for container in added:
        where = named(container.kind, container.index, container.name)
        for entry in container.env:
            name = entry.get("name")
            if is_bypass_entry(entry) or (name in GPU_POD_ONLY_ENV and gpu_pod):
                problems.append(Refusal("isolation-env", 403,
                                        f"{where} sets {name} itself, which bypasses GPU isolation; remove it"))
        if any(isinstance(r, str) and is_gpu_resource(r) for part in (container.limits, container.requests)
               for r in part):
            problems.append(Refusal("ephemeral-resources", 422,
                                    f"{where} asks for GPUs; ephemeral containers cannot have resources"))
        if on_gpu_node and container.privileged:
            problems.append(Refusal("isolation-privileged", 403,
                                    f"{where} is privileged on a GPU node, which exposes every GPU of the node; "
                                    "set securityContext.privileged: false"))
    return problems
