"""A claim that admitted pods hold, written again with more GPUs, is judged against the quota their
namespace has left: the pods were counted with the old size, and the DRA driver would give them the new
one (deleted and re-created while the pod waits at a scheduling gate, or a template edited before the
controller makes the pods' claims)."""

from __future__ import annotations

from typing import Any

from webhook.cluster.translate import build_snapshot
from webhook.core.admission.dra_objects import check_claim_object
from webhook.core.domain.model import Snapshot
from webhook.core.policy.model import Policy

NS = "team-a"
POLICY = Policy(managed_namespaces="all")


def claim(name: str, gpus: int, kind: str = "ResourceClaim") -> dict[str, Any]:
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                   "count": gpus}}]}}
    meta = {"name": name, "namespace": NS}
    if kind == "ResourceClaimTemplate":
        return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": {"spec": spec}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": spec}


def holder(name: str, *, claim_name: str | None = None, template: str | None = None) -> dict[str, Any]:
    entry = {"name": "gpu", **({"resourceClaimName": claim_name} if claim_name else {}),
             **({"resourceClaimTemplateName": template} if template else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {"schedulingGates": [{"name": "wait"}], "resourceClaims": [entry],
                     "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}]},
            "status": {"phase": "Pending"}}


def cluster(*objects: dict[str, Any]) -> Snapshot:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "h1", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559"}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-quota", "namespace": NS},
             "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}}
    return build_snapshot([node, namespace, quota, *objects])


def write(obj: dict[str, Any], snapshot: Snapshot, operation: str = "CREATE") -> Any:
    request: dict[str, Any] = {"operation": operation, "namespace": NS, "object": obj}
    if operation == "UPDATE":
        request["oldObject"] = {**obj, "spec": {}}
    return check_claim_object(request, snapshot, POLICY)


def test_a_held_claim_recreated_larger_than_the_quota_has_room_for_is_refused() -> None:
    # The pod was admitted holding a 1-GPU claim; 2 more GPUs are held by another claim's pod.
    snap = cluster(claim("mine", 1), holder("waiting", claim_name="mine"),
                   claim("other", 2), holder("running", claim_name="other"))
    assert snap.namespace_usage[NS].gpus == 3
    assert snap.claim_users[NS][("ResourceClaim", f"{NS}/mine")] == 1
    decision = write(claim("mine", 4), snap)
    assert not decision.allowed and decision.code == 403 and decision.reason == "quota-exceeded"
    assert "ResourceClaim mine is held by 1 admitted pod(s) and counted at 1 GPU(s); written with 4" in decision.message
    assert "requests.nvidia.com/gpu used 3, asked 3, limit 4" in decision.message
    # Growth the quota has room for is admitted, and so is the same size again.
    assert write(claim("mine", 2), snap).allowed
    assert write(claim("mine", 1), snap).allowed


def test_a_deleted_claim_recreated_while_its_pod_waits_counts_whole() -> None:
    # The claim is gone (its pod still names it and counts nothing for it): a new one counts in full.
    snap = cluster(holder("waiting", claim_name="mine"), claim("other", 2), holder("running", claim_name="other"))
    assert snap.namespace_usage[NS].gpus == 2
    assert not write(claim("mine", 3), snap).allowed
    assert write(claim("mine", 2), snap).allowed


def test_a_claim_no_admitted_pod_holds_is_judged_alone() -> None:
    snap = cluster(claim("other", 3), holder("running", claim_name="other"))
    assert write(claim("spare", 4), snap).allowed  # counted when a pod uses it, refused then if over


def test_a_template_edited_before_its_claims_are_made_counts_once_per_waiting_pod() -> None:
    snap = cluster(claim("tpl", 1, "ResourceClaimTemplate"), holder("w0", template="tpl"),
                   holder("w1", template="tpl"))
    assert snap.namespace_usage[NS].gpus == 2
    assert write(claim("tpl", 2, "ResourceClaimTemplate"), snap, "UPDATE").allowed  # 2 x 2 fits a quota of 4
    decision = write(claim("tpl", 3, "ResourceClaimTemplate"), snap, "UPDATE")
    assert not decision.allowed and "held by 2 admitted pod(s)" in decision.message
    assert "used 2, asked 4, limit 4" in decision.message
    assert write(claim("tpl", 3, "ResourceClaimTemplate"), cluster(claim("tpl", 1, "ResourceClaimTemplate"),
                                                                    holder("w0", template="tpl"))).allowed
