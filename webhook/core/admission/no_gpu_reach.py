"""A pod that asks for no GPU but can still reach one: through a GPU RuntimeClass, a toleration of the GPU
taint, or a GPU node named in spec.nodeName. Its image's NVIDIA_VISIBLE_DEVICES=all would show it every
GPU of the node it lands on, so the policy (`isolation.nonGpuAccess`) either refuses it or has the mutation
write NVIDIA_VISIBLE_DEVICES=void into every container (`neutralise.py`); a privileged container that can
reach a GPU node is refused, whatever the toolkit says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from webhook.core.domain.decision import Decision, warning
from webhook.core.domain.model import Snapshot
from webhook.core.domain.podview import PodView
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.limits import NO_DEVICES
from webhook.core.podspec.vendor_table import COUNT_RESOURCES
from webhook.core.podspec.view import as_view, view_for
from webhook.core.policy.model import Policy

from .envfrom import env_from, named
from .neutralise import VISIBLE, lacking, no_gpu_allowed, no_gpu_denied, void_ops
from .scope import is_managed

# The taints GPU nodes carry for the device plugins of the vendor table (and the chart's toleration).
GPU_TAINT_KEYS: frozenset[str] = frozenset(COUNT_RESOURCES.values())

# A pod asking only for accelerators outside the vendor table (gpu.intel.com/i915, habana.ai/gaudi): no
# GPU of this controller, admitted unchanged with a warning, and screened like any pod asking for none.
FOREIGN_ACCELERATOR = "accelerator-not-counted"
NO_GPU_ANSWERS = frozenset({"not-gpu-pod", "no-gpu-requested", FOREIGN_ACCELERATOR})


def reach(pod: Mapping[str, Any] | PodView, snapshot: Snapshot, policy: Policy, *, privileged: bool = False
          ) -> list[str]:
    """Why a pod that asks for no GPU could still get one: a GPU RuntimeClass (the NVIDIA hook honours
    the image's NVIDIA_VISIBLE_DEVICES), the GPU taint tolerated, or a GPU node named in spec.nodeName.
    `privileged`: for a privileged container, which sees every device node whatever the toolkit says."""
    view = as_view(pod)
    reasons: list[str] = []
    runtime = view.runtime_class_name
    if runtime and runtime in policy.gpu_runtime_classes:
        reasons.append(f"runtimeClassName {runtime}")
    node_name = view.node_name
    if node_name:
        node = snapshot.nodes.get(node_name)
        if node is None:
            reasons.append(f"spec.nodeName {node_name}, a node the webhook does not know")
        elif node.gpus and (privileged or node.toolkit_envvar is not False):
            # A node whose toolkit ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers (its agent says
            # so: node_routes.py) gives no GPU through the image's variable: nothing to neutralise there.
            reasons.append(f"spec.nodeName {node_name}, a GPU node")
    keys = GPU_TAINT_KEYS.union(str(t.get("key")) for t in policy.tolerations if t.get("key"))
    for toleration in view.tolerations:
        key = toleration.get("key")
        if not key and toleration.get("operator") == "Exists":
            reasons.append("a toleration of every taint")
        elif isinstance(key, str) and key in keys:
            reasons.append(f"a toleration of the {key} taint")
    return reasons


def _privileged(pod: PodView) -> list[str]:
    return [named(c.kind, c.index, c.name) for c in pod.of_kind("containers", "initContainers") if c.privileged]


def after_screen(pod: Mapping[str, Any], request: PodRequest, final: Decision, snapshot: Snapshot, policy: Policy,
                 *, mutating: bool) -> Decision:
    """The answer for a pod the first screen settled: a pod that asks for no GPU, in a managed namespace,
    is screened here too (the rest is returned as it was). That includes a pod that names a GPU resource
    with a count of 0 (`nvidia.com/gpu: 0`): the device plugin gives it no device, but a CUDA image's own
    NVIDIA_VISIBLE_DEVICES=all would still reach every GPU of the node it lands on."""
    if final.reason not in NO_GPU_ANSWERS or not is_managed(request.namespace, snapshot, policy):
        return final
    decision = screen_non_gpu(pod, request, snapshot, policy, mutating=mutating)
    if decision is None:
        return final
    if not final.warnings:
        return decision
    return replace(decision, warnings=(*final.warnings, *decision.warnings), allocation=None, managed=True,
                   gpu_pod=False)


def screen_non_gpu(pod: Mapping[str, Any], request: PodRequest, snapshot: Snapshot, policy: Policy, *,
                   mutating: bool) -> Decision | None:
    """A pod of a managed namespace that asks for no GPU. None: nothing to say (allowed unchanged)."""
    view = view_for(request, pod)
    violations, _ = env_from(view, request.namespace, snapshot, gpu_pod=False)
    if violations:
        return no_gpu_denied(403, violations[0].rule, "; ".join(v.message for v in violations))
    privileged = _privileged(view)
    if privileged and (found := reach(view, snapshot, policy, privileged=True)):
        return no_gpu_denied(403, "isolation-privileged",
                             f"{privileged[0]} is privileged and the pod can reach a GPU node ({', '.join(found)}): "
                             "a privileged container sees every GPU of the node; set securityContext.privileged: "
                             "false or remove that")
    reasons = reach(view, snapshot, policy)
    if not reasons:
        return None  # cannot land on a (tainted) GPU node: whatever its image says, no GPU is there
    why = ", ".join(reasons)
    if policy.non_gpu_access == "deny":
        return no_gpu_denied(403, "gpu-reachable",
                             f"asks for no GPU but can reach one ({why}), which bypasses GPU admission: remove that, "
                             "or ask for GPUs in resources.limits (e.g. nvidia.com/gpu: 1)")
    targets = [(c.kind, c.index) for c in view.of_kind("containers", "initContainers")]
    if mutating:
        ops = void_ops(view, targets)
        note = warning(f"asks for no GPU but can reach one ({why}): {VISIBLE}={NO_DEVICES} set in every container")
        return no_gpu_allowed("neutralised", f"{VISIBLE}={NO_DEVICES}", ops, (note,) if ops else ())
    missing = lacking(view, targets)
    if missing:
        return no_gpu_denied(403, "gpu-reachable",
                             f"asks for no GPU but can reach one ({why}), and {missing[0]} lacks "
                             f"{VISIBLE}={NO_DEVICES} that the mutating webhook writes: retry the create, or "
                             "remove that")
    return no_gpu_allowed("neutralised", f"{VISIBLE}={NO_DEVICES}")
