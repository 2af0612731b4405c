"""Over-allocation rules: requests that break the namespace's policy or that no node could ever host.

Each check returns the denial (code, rule, message) or None; messages carry the figures and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Node, PodRequest, Snapshot, TopologyPreference
from .policy import Policy


@dataclass(frozen=True)
class Denial:
    code: int
    rule: str
    message: str


def _matches(model: str, patterns: tuple[str, ...]) -> bool:
    lowered = model.lower()
    return any(p.strip().lower() in lowered for p in patterns if p.strip())


def model_allowed(model: str, request: PodRequest) -> bool:
    """HAMi's use-gputype / nouse-gputype semantics: case-insensitive substrings of the model."""
    if request.models_include and not _matches(model, request.models_include):
        return False
    return not (request.models_exclude and _matches(model, request.models_exclude))


def check_policy(request: PodRequest, policy: Policy) -> Denial | None:
    """The namespace's own rules from the policy file (403: the cluster could, the policy says no)."""
    rule = policy.rule(request.namespace)
    if rule.max_gpus_per_pod is not None and request.gpus > rule.max_gpus_per_pod:
        return Denial(
            403,
            "max-gpus-per-pod",
            f"asks for {request.gpus} GPUs in one pod; namespace {request.namespace} allows at most "
            f"{rule.max_gpus_per_pod} per pod (policy namespaces.{request.namespace}.maxGpusPerPod): "
            f"split the work into pods of at most {rule.max_gpus_per_pod} GPUs",
        )
    if not rule.allow_sharing and request.shared:
        return Denial(
            403,
            "sharing-not-allowed",
            f"asks for a slice of a GPU, but namespace {request.namespace} does not allow GPU sharing "
            f"(policy namespaces.{request.namespace}.allowSharing): remove nvidia.com/gpumem, "
            "gpumem-percentage and gpucores to get whole GPUs",
        )
    if rule.allowed_models and request.models_include:
        wanted = [m for m in request.models_include if not _matches(m, rule.allowed_models)]
        if len(wanted) == len(request.models_include):
            return Denial(
                403,
                "model-not-allowed",
                f"asks for GPU model {', '.join(request.models_include)}; namespace {request.namespace} may "
                f"use only {', '.join(rule.allowed_models)}",
            )
    return None


def _vendor_nodes(request: PodRequest, snapshot: Snapshot) -> list[Node]:
    return [n for n in snapshot.nodes.values() if n.gpus and n.vendor == request.vendor]


def check_satisfiable(request: PodRequest, snapshot: Snapshot, policy: Policy, largest_nvlink: int) -> Denial:
    """Why no node could ever host the request: the most specific reason that applies (422)."""
    vendor_nodes = _vendor_nodes(request, snapshot)
    if not vendor_nodes:
        return Denial(422, "no-such-gpu", f"asks for {request.vendor} GPUs, but no node in the cluster has any")
    rule = policy.rule(request.namespace)
    models = sorted({n.gpu_model for n in vendor_nodes})
    eligible = [
        n for n in vendor_nodes
        if model_allowed(n.gpu_model, request)
        and (not rule.allowed_models or _matches(n.gpu_model, rule.allowed_models))
    ]
    if not eligible:
        asked = ", ".join(request.models_include) or "(any)"
        excluded = f", excluding {', '.join(request.models_exclude)}" if request.models_exclude else ""
        return Denial(
            422,
            "no-such-model",
            f"asks for GPU model {asked}{excluded}; the cluster has {', '.join(models)}: "
            "change nvidia.com/use-gputype or nvidia.com/nouse-gputype",
        )
    largest = max(len(n.gpus) for n in eligible)
    if request.gpus > largest:
        return Denial(
            422,
            "too-many-gpus",
            f"asks for {request.gpus} GPUs in one pod; the largest eligible node has {largest}: "
            f"ask for at most {largest}, or split the job into several pods",
        )
    topology = request.topology or policy.topology
    if topology is TopologyPreference.REQUIRED and request.gpus > largest_nvlink:
        return Denial(
            422,
            "topology-unsatisfiable",
            f"asks for {request.gpus} GPUs all linked by NVLink (gpu-admission.io/topology: required); "
            f"the largest NVLink-connected set on any eligible node has {largest_nvlink} GPUs: ask for at most "
            f"{largest_nvlink}, or set gpu-admission.io/topology: preferred",
        )
    largest_card = max(g.memory_mib for n in eligible for g in n.gpus)
    if request.memory_mib is not None and request.memory_mib > largest_card:
        return Denial(
            422,
            "memory-too-large",
            f"asks for {request.memory_mib} MiB of GPU memory per GPU; the largest eligible card has "
            f"{largest_card} MiB: lower nvidia.com/gpumem to at most {largest_card}",
        )
    if request.uuids_include:
        uuids = {g.uuid for n in eligible for g in n.gpus}
        if not uuids.intersection(request.uuids_include):
            return Denial(
                422,
                "no-such-uuid",
                f"asks for GPU UUIDs {', '.join(request.uuids_include)} (nvidia.com/use-gpuuuid); no eligible "
                "node has any of them",
            )
    return Denial(
        422,
        "unschedulable",
        f"no node could ever host {request.gpus} GPU(s) with these constraints (CPU {request.cpu_milli}m, "
        f"memory {request.memory_mib_host} MiB, model, UUID and topology filters): relax the request",
    )
