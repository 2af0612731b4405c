"""Capacity that does not exist yet: node pools that scale from zero, and pods that ask for capacity to be
provisioned for them.

Cluster-autoscaler (scale from zero), Karpenter NodePools and GKE's ProvisioningRequests (DWS, through
Kueue's provisioning admission check) make a node only after a pod exists that needs it. A pod that no
existing node can host, but a declared pool could (policy `capacity.scaleFromZero`), or that consumes a
ProvisioningRequest, is therefore admitted to wait: placement is left to the scheduler and the autoscaler,
and the pod gets the limits it would get on the pool's card.

A pool is judged as the node it would make: its labels against the pod's nodeSelector and required node
affinity, its taints against the pod's tolerations (with those the mutation adds), its GPUs against the
request (vendor, count, memory per GPU, model filters and the namespace's allowedModels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.domain.model import Gpu, Node, PodRequest
from webhook.core.placement.nodeconstraints import NodeConstraints
from webhook.core.policy.model import ScalePool

# Pods consuming a ProvisioningRequest: cluster-autoscaler's keys (current and the earlier ones that Kueue
# and GKE still write). Such a pod waits for the node the request provisions.
PROVISIONING_ANNOTATIONS = (
    "autoscaling.x-k8s.io/consume-provisioning-request",
    "cluster-autoscaler.kubernetes.io/consume-provisioning-request",
)
AWAITING = "awaiting-capacity"  # the decision's reason when the pod waits for a node to be made


@dataclass(frozen=True)
class Awaiting:
    """Where an admitted pod's node will come from: a declared pool (`pool`, and `node`, the node it would
    make), or a ProvisioningRequest (`request`) with no pool known."""

    pool: ScalePool | None
    node: Node | None
    request: str = ""

    @property
    def source(self) -> str:
        if self.pool is not None:
            return f"pool {self.pool.name}"
        return f"the autoscaler (ProvisioningRequest {self.request})"

    @property
    def note(self) -> str:
        return f"no node can host it now; it waits for capacity from {self.source}"


def provisioning_request(pod: Mapping[str, Any]) -> str:
    """The ProvisioningRequest the pod consumes ("" when none)."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return ""
    for key in PROVISIONING_ANNOTATIONS:
        value = annotations.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def pool_node(pool: ScalePool) -> Node:
    """The node a pool would make: its labels, taints and GPUs (no links known)."""
    gpus = tuple(Gpu(i, "", pool.gpu_model, pool.memory_mib) for i in range(pool.gpu_count))
    return Node(f"(pool {pool.name})", gpus=gpus, vendor=pool.vendor, labels=pool.labels, taints=pool.taints)


def _matches(model: str, patterns: tuple[str, ...]) -> bool:
    lowered = model.lower()
    return any(p.strip().lower() in lowered for p in patterns if p.strip())


def misfit(request: PodRequest, pool: ScalePool, constraints: NodeConstraints,
           allowed_models: tuple[str, ...] = ()) -> str:
    """Why the pool's nodes could never host the request ("" when they could)."""
    if pool.vendor != request.vendor:
        return f"{pool.vendor} GPUs"
    reason = constraints.refusal(pool_node(pool))
    if reason:
        return f"its nodes fail the pod's {constraints.describe(reason)}"
    model = pool.gpu_model
    if request.models_include and not _matches(model, request.models_include):
        return f"model {model or '(not declared)'} is not {', '.join(request.models_include)}"
    if request.models_exclude and model and _matches(model, request.models_exclude):
        return f"model {model} is excluded"
    if allowed_models and not _matches(model, allowed_models):
        return f"model {model or '(not declared)'} is not among allowedModels {', '.join(allowed_models)}"
    if request.gpus > pool.gpu_count:
        return f"{pool.gpu_count} GPUs per node"
    if request.memory_mib and request.memory_mib > pool.memory_mib:
        known = f"{pool.memory_mib} MiB" if pool.memory_mib else "undeclared memory"
        return f"cards of {known}"
    if request.uuids_include:
        return "a new node has none of the GPU UUIDs asked for"
    return ""


def pool_for(request: PodRequest, pools: tuple[ScalePool, ...], constraints: NodeConstraints,
             allowed_models: tuple[str, ...] = ()) -> tuple[ScalePool | None, dict[str, str]]:
    """The first declared pool that could host the request, and why each one before it could not."""
    misfits: dict[str, str] = {}
    for pool in pools:
        why = misfit(request, pool, constraints, allowed_models)
        if not why:
            return pool, misfits
        misfits[pool.name] = why
    return None, misfits


def considered(misfits: Mapping[str, str]) -> str:
    """The pools considered and why none fits, for a refusal's message ("" when none is declared)."""
    if not misfits:
        return ""
    return "; no scale-from-zero pool fits either (" + "; ".join(f"{n}: {w}" for n, w in misfits.items()) + ")"
