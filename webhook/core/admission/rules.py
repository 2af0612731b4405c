"""Over-allocation rules: requests that break the namespace's policy or that no node could ever host.

Each check returns the `Refusal` (rule, code, message) or None; messages carry the figures and the fix.

Cost: `check_satisfiable` reads per node shape from the placement index, not per node, so a refusal
costs about as little as an admission.
"""

from __future__ import annotations

from dataclasses import replace

from webhook.core.domain.model import Allocation, Snapshot
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.request import PodRequest, TopologyPreference
from webhook.core.placement.capacity import Awaiting, considered, pool_for, pools_of, provisioning_request
from webhook.core.placement.nodeconstraints import AFFINITY, CORDONED, SELECTOR, TAINT, NodeConstraints
from webhook.core.placement.nodeindex import Shape, Statics
from webhook.core.placement.nodereach import ShapeReach, count_rejections, reach_of, shape_names
from webhook.core.placement.place import constraints_for
from webhook.core.placement.state import index_of
from webhook.core.placement.topology import largest_nvlink_clique
from webhook.core.podspec.vendor_table import memory_name, selector_names
from webhook.core.podspec.view import view_for
from webhook.core.policy.model import Policy


def matches_model(model: str, patterns: tuple[str, ...]) -> bool:
    """allowedModels' semantics: case-insensitive substrings of the model name."""
    lowered = model.lower()
    return any(p.strip().lower() in lowered for p in patterns if p.strip())


_matches = matches_model


def model_allowed(model: str, request: PodRequest, allowed_models: tuple[str, ...] = ()) -> bool:
    """HAMi's use-gputype / nouse-gputype semantics: case-insensitive substrings of the model; and the
    namespace's allowedModels (same matching) when given."""
    if request.models_include and not _matches(model, request.models_include):
        return False
    if allowed_models and not _matches(model, allowed_models):
        return False
    return not (request.models_exclude and _matches(model, request.models_exclude))


def check_policy(request: PodRequest, policy: Policy) -> Refusal | None:
    """The namespace's own rules from the policy file (403: the cluster could, the policy says no)."""
    rule = policy.rule(request.namespace)
    if rule.max_gpus_per_pod is not None and request.gpus > rule.max_gpus_per_pod:
        return Refusal(
            "max-gpus-per-pod", 403,
            f"asks for {request.gpus} GPUs in one pod; namespace {request.namespace} allows at most "
            f"{rule.max_gpus_per_pod} per pod (policy namespaces.{request.namespace}.maxGpusPerPod): "
            f"split the work into pods of at most {rule.max_gpus_per_pod} GPUs",
        )
    if not rule.allow_sharing and request.shared:
        return Refusal(
            "sharing-not-allowed", 403,
            f"asks for a slice of a GPU, but namespace {request.namespace} does not allow GPU sharing "
            f"(policy namespaces.{request.namespace}.allowSharing): remove nvidia.com/gpumem, "
            "gpumem-percentage and gpucores to get whole GPUs",
        )
    if rule.allowed_models and request.models_include:
        wanted = [m for m in request.models_include if not _matches(m, rule.allowed_models)]
        if len(wanted) == len(request.models_include):
            return Refusal(
                "model-not-allowed", 403,
                f"asks for GPU model {', '.join(request.models_include)}; namespace {request.namespace} may "
                f"use only {', '.join(rule.allowed_models)}",
            )
    return None


def whole_cards(allocation: Allocation, snapshot: Snapshot) -> bool:
    """Whether a recorded allocation holds whole cards (all of each card's compute and memory): the
    decision annotation records a whole card as its memory, which is no slice of it."""
    if allocation.cores < 100:
        return False
    node = snapshot.nodes.get(allocation.node) if allocation.node else None
    if node is not None and allocation.gpus and 0 <= allocation.gpus[0] < len(node.gpus):
        return allocation.memory_mib >= node.gpus[allocation.gpus[0]].memory_mib
    cards = [g.memory_mib for s in index_of(snapshot).statics.shapes if s.template.gpu_model == allocation.model
             for g in s.template.gpus]  # recorded while the cluster was full: no node chosen
    return allocation.memory_mib >= max(cards, default=allocation.memory_mib)


def awaiting_capacity(request: PodRequest, policy: Policy, snapshot: Snapshot | None = None) -> Awaiting | None:
    """For a request no existing node can ever host: the capacity it may wait for instead of being refused,
    a pool that scales from zero whose nodes could host it (the policy's capacity.scaleFromZero, then the
    NodePools and node groups the snapshot read from the cluster), else the ProvisioningRequest it
    consumes; None when neither (core/placement/capacity.py)."""
    if request.mig or request.dra_gpus or not request.vendor:
        return None
    pools = pools_of(policy.scale_from_zero, snapshot.scale_pools if snapshot is not None else ())
    if pools:
        constraints = constraints_for(request, policy.tolerations)
        awaiting, _ = pool_for(request, pools, constraints, policy.rule(request.namespace).allowed_models)
        if awaiting is not None:
            return replace(awaiting, request=provisioning_request(view_for(request)))
    name = provisioning_request(view_for(request))
    return Awaiting(None, None, name) if name else None


def check_satisfiable(request: PodRequest, snapshot: Snapshot, policy: Policy) -> Refusal:
    """Why no node could ever host the request: the most specific reason that applies (422).

    Only nodes the pod itself can reach count (its nodeSelector, required node affinity, tolerations,
    cordons), and the message names the constraint that narrowed the choice, then the scale-from-zero
    pools considered (the policy's and the cluster's) and why none of them fits either."""
    refusal = _satisfiable(request, snapshot, policy)
    pools = pools_of(policy.scale_from_zero, snapshot.scale_pools)
    if not pools:
        return refusal
    constraints = constraints_for(request, policy.tolerations)
    _, misfits = pool_for(request, pools, constraints, policy.rule(request.namespace).allowed_models)
    return replace(refusal, message=refusal.message + considered(misfits))


def _satisfiable(request: PodRequest, snapshot: Snapshot, policy: Policy) -> Refusal:
    statics = index_of(snapshot).statics
    shapes = [s for s in statics.shapes if s.template.gpus and s.template.vendor == request.vendor]
    if not shapes:
        return Refusal("no-such-gpu", 422, f"asks for {request.vendor} GPUs, but no node in the cluster has any")
    constraints = constraints_for(request, policy.tolerations)
    reach = reach_of(statics, constraints)
    cordon_ok = constraints.cordon_ok
    refused: dict[str, int] = {}
    reachable: list[Shape] = []
    for shape in shapes:
        count_rejections(reach, shape, refused)
        names = shape_names(reach, shape)
        count = len(shape.names) if names is None else len(names)
        if count and shape.template.unschedulable and not cordon_ok:
            refused[CORDONED] = refused.get(CORDONED, 0) + count
        elif count:
            reachable.append(shape)
    if not reachable:
        return _unreachable(request, constraints, refused, sum(len(s.names) for s in shapes))
    where = " and ".join(constraints.describe(r) for r in (SELECTOR, AFFINITY, TAINT) if refused.get(r))
    if refused.get(CORDONED):
        where = f"{where}, cordoned nodes aside," if where else "the pod's constraints (cordoned nodes aside)"
    rule = policy.rule(request.namespace)
    models = sorted({s.template.gpu_model for s in reachable})
    eligible = [s for s in reachable if model_allowed(s.template.gpu_model, request, rule.allowed_models)]
    if not eligible:
        return _no_model(request, rule.allowed_models, models, where)
    within = f" matching {where}" if where else ""
    too_large = _too_large(request, eligible, where, request.topology or policy.topology)
    if too_large is not None:
        return too_large
    if request.uuids_include:
        usable = {id(s) for s in eligible}
        found = [statics.uuid_node.get(u) for u in request.uuids_include]
        if not any(w and id(statics.shape_of[w[0]]) in usable and (reach is None or _admits(reach, statics, w[0]))
                   for w in found):
            return Refusal(
                "no-such-uuid", 422,
                f"asks for GPU UUIDs {', '.join(request.uuids_include)} ({selector_names(request.vendor)[2]}); "
                f"no eligible node{within} has any of them",
            )
    return Refusal(
        "unschedulable", 422,
        f"no node{within} could ever host {request.gpus} GPU(s) with these constraints (CPU "
        f"{request.cpu_milli}m, memory {request.memory_mib_host} MiB, model, UUID and topology filters): "
        "relax the request",
    )


def _too_large(request: PodRequest, eligible: list[Shape], where: str,
               topology: TopologyPreference) -> Refusal | None:
    """Why no eligible node could hold the request's size (GPU count, NVLink-connected set, card memory),
    or None. `where` names the node constraints that narrowed the nodes ("" when none did)."""
    largest = max(len(s.template.gpus) for s in eligible)
    if request.gpus > largest:
        if where:
            return Refusal(
                "too-many-gpus", 422,
                f"no node matching {where} has {request.gpus} GPUs; the largest has {largest}: ask for at most "
                f"{largest}, or widen the pod's node constraints",
            )
        return Refusal(
            "too-many-gpus", 422,
            f"asks for {request.gpus} GPUs in one pod; the largest eligible node has {largest}: "
            f"ask for at most {largest}, or split the job into several pods",
        )
    within = f" matching {where}" if where else ""
    largest_nvlink = max(largest_nvlink_clique(s.template) for s in eligible)
    if topology is TopologyPreference.REQUIRED and request.gpus > largest_nvlink:
        return Refusal(
            "topology-unsatisfiable", 422,
            f"asks for {request.gpus} GPUs all linked by NVLink (gpu-admission.io/topology: required); "
            f"the largest NVLink-connected set on any eligible node{within} has {largest_nvlink} GPUs: ask for "
            f"at most {largest_nvlink}, or set gpu-admission.io/topology: preferred",
        )
    largest_card = max(g.memory_mib for s in eligible for g in s.template.gpus)
    if (request.memory_mib or request.shared) and largest_card == 0:  # no eligible node states its cards' memory
        source = ("no nvidia.com/gpu.memory label (GPU Feature Discovery sets it) and no GPUInventory "
                  "(`gpu-admission agent` publishes one)" if request.vendor == "nvidia" else
                  "no GPU memory resource in status.allocatable and no GPUInventory")
        asked = (f"{request.memory_mib} MiB of GPU memory per GPU" if request.memory_mib else
                 "a share of a GPU, whose memory limit would be a share of an unknown size")
        return Refusal(
            "memory-too-large", 422,
            f"asks for {asked}, but the GPU memory of the eligible nodes{within} is unknown: their Nodes have "
            f"{source}; add that to the nodes, or ask for whole GPUs",
        )
    if request.memory_mib is not None and request.memory_mib > largest_card:
        return Refusal(
            "memory-too-large", 422,
            f"asks for {request.memory_mib} MiB of GPU memory per GPU; the largest eligible card{within} has "
            f"{largest_card} MiB: lower {memory_name(request.vendor)} to at most {largest_card}",
        )
    return None


def _admits(reach: ShapeReach, statics: Statics, name: str) -> bool:
    names = reach.names.get(statics.shape_of[name].number)
    return names is None or name in names


def _unreachable(request: PodRequest, constraints: NodeConstraints, refused: dict[str, int], total: int) -> Refusal:
    """No GPU node of the vendor is one the pod's own constraints allow: say what excluded each."""
    parts = [f"{refused[r]} not matching {constraints.describe(r)}" for r in (SELECTOR, AFFINITY) if refused.get(r)]
    if refused.get(TAINT):
        parts.append(f"{refused[TAINT]} with a NoSchedule/NoExecute taint it does not tolerate")
    if refused.get(CORDONED):
        parts.append(f"{refused[CORDONED]} cordoned (spec.unschedulable)")
    return Refusal(
        "no-matching-node", 422,
        f"asks for {request.vendor} GPUs, but no GPU node meets the pod's own constraints (of {total} "
        f"{request.vendor} GPU nodes: {'; '.join(parts)}): change its nodeSelector, node affinity or tolerations",
    )


def _no_model(request: PodRequest, allowed: tuple[str, ...], models: list[str], where: str) -> Refusal:
    asked = ", ".join(request.models_include) or "(any)"
    excluded = f", excluding {', '.join(request.models_exclude)}" if request.models_exclude else ""
    have = f"the nodes matching {where} have" if where else "the cluster has"
    permitted = [m for m in models if model_allowed(m, request)]
    if allowed and permitted:
        return Refusal(
            "no-such-model", 422,
            f"namespace {request.namespace} may use only GPU models {', '.join(allowed)} (policy namespaces."
            f"{request.namespace}.allowedModels), and {have} {', '.join(models)}: ask an administrator",
        )
    return Refusal(
        "no-such-model", 422,
        f"asks for GPU model {asked}{excluded}; {have} {', '.join(models)}: "
        f"change {selector_names(request.vendor)[0]} or {selector_names(request.vendor)[1]}",
    )
