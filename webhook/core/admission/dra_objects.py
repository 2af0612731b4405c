"""Admission of ResourceClaim and ResourceClaimTemplate objects in managed namespaces.

A claim's GPUs are counted when a pod uses it (core/dra.py); refusing what can never be counted when
the claim is written tells its author at once, instead of at the pod: allocationMode All on a GPU
class, adminAccess, a model the namespace may not use, and a count above the per-pod maximum or above
a GPU quota of the namespace (no pod could ever use such a claim), and a claim that admitted pods
hold written again with more GPUs than their namespace's quota has room for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied
from webhook.core.domain.model import Snapshot, Usage
from webhook.core.podspec.coerce import mapping_of
from webhook.core.policy.model import Policy

from .dra import CLAIM_KINDS, Tally, claim_gpus, count_claim, largest_card, read_claim
from .quota import check_quota
from .scope import is_managed


def _deny(code: int, reason: str, message: str) -> Decision:
    return denied(code, reason, message, gpu_pod=False)


def check_claim_object(request: Mapping[str, Any], snapshot: Snapshot, policy: Policy) -> Decision:
    """Decide a CREATE or UPDATE of a ResourceClaim or ResourceClaimTemplate (an AdmissionRequest)."""
    obj = mapping_of(request.get("object"))
    kind = str(obj.get("kind") or mapping_of(request.get("kind")).get("kind") or "")
    if kind not in CLAIM_KINDS:
        return allowed("not-a-claim", gpu_pod=False)
    namespace = str(request.get("namespace") or mapping_of(obj.get("metadata")).get("namespace") or "default")
    if not is_managed(namespace, snapshot, policy):
        return allowed("not-managed", managed=False, gpu_pod=False)
    old = request.get("oldObject")
    if request.get("operation") == "UPDATE" and isinstance(old, Mapping) and old.get("spec") == obj.get("spec"):
        return allowed("spec-unchanged", gpu_pod=False)  # finalizers, labels: nothing to count
    try:
        claim = read_claim({**obj, "kind": kind, "metadata": {**mapping_of(obj.get("metadata")),
                                                              "namespace": namespace}})
    except ValueError as err:
        return _deny(422, "dra-invalid", f"{kind}: {err}")
    tally = Tally()
    count_claim(claim, f"{kind} {claim.name}", namespace, policy, tally)
    if tally.violations:
        first = tally.violations[0]
        return _deny(first.code, first.rule, "; ".join(v.message for v in tally.violations))
    if not tally.gpus:
        return allowed("no-gpu-requested", gpu_pod=False)
    limit = policy.rule(namespace).max_gpus_per_pod
    if limit is not None and tally.gpus > limit:
        return _deny(403, "max-gpus-per-pod",
                     f"{kind} {claim.name} asks for {tally.gpus} GPUs; namespace {namespace} allows at most {limit} "
                     f"per pod (policy namespaces.{namespace}.maxGpusPerPod), so no pod could use it")
    for quota in snapshot.quotas.get(namespace, ()):
        if quota.gpus is not None and tally.gpus > quota.gpus:
            return _deny(403, "quota-exceeded",
                         f"{kind} {claim.name} asks for {tally.gpus} GPUs, above ResourceQuota {namespace}/"
                         f"{quota.name} (requests.nvidia.com/gpu limit {quota.gpus}), so no pod could use it")
    grown = _grown_for_holders(kind, claim.name, namespace, tally.gpus, snapshot, policy)
    if grown is not None:
        return grown
    return allowed("admitted", f"{tally.gpus} GPU(s), counted when a pod uses it", gpu_pod=False)


def _grown_for_holders(kind: str, name: str, namespace: str, gpus: int, snapshot: Snapshot,
                       policy: Policy) -> Decision | None:
    """A claim (or template) that admitted pods already hold, written again with more GPUs (deleted and
    re-created, or a template edited before its claims are made): the pods' quota was checked with the
    old size, and the DRA driver would give them the new one. Refused when the growth breaks a quota."""
    key = (kind, f"{namespace}/{name}")
    holders = snapshot.claim_users.get(namespace, {}).get(key, 0)
    if not holders:
        return None
    table = snapshot.claims if kind == "ResourceClaim" else snapshot.claim_templates
    before = table.get(key[1])
    counted = claim_gpus(before, policy.dra_device_classes) if before is not None else 0
    growth = (gpus - counted) * (1 if kind == "ResourceClaim" else holders)
    if growth <= 0:
        return None
    card = largest_card(snapshot.nodes)
    check = check_quota(namespace, Usage(growth, growth * card, growth * 100), snapshot)
    if check.refusal is None:
        return None
    return _deny(check.refusal.code, check.refusal.rule,
                 f"{kind} {name} is held by {holders} admitted pod(s) and counted at {counted} GPU(s); written "
                 f"with {gpus} it {check.refusal.message}")
