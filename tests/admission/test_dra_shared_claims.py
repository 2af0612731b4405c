"""Shared DRA claims and claims that hold no GPU.

NVIDIA's DRA driver demo `gpu-test3` (tests/fixtures/dra/nvidia-dra-driver-gpu-test3.yaml): two pods name
one ResourceClaim, and share its one GPU. The watch cache counts the claim once, with the live pods that
hold it, so the second pod's admission must not charge it again. A ComputeDomain's IMEX channel template
(tests/fixtures/dra/nvidia-dra-driver-imex-channel-injection.yaml) holds no GPU: it counts 0 and passes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.admission.dra_objects import check_claim_object
from webhook.core.admission.updates import pod_update
from webhook.core.domain.model import Snapshot
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import NamespaceRule, Policy

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dra"
POLICY = Policy(managed_namespaces="all")


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]


NAMESPACE, CLAIM, POD1, POD2 = documents("nvidia-dra-driver-gpu-test3.yaml")
NS = NAMESPACE["metadata"]["name"]
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "h1", "labels": {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81559"}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


def quota(gpus: int, namespace: str = NS) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-quota", "namespace": namespace},
            "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}}}


def claim(name: str, gpus: int, kind: str = "ResourceClaim", reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                   "count": gpus}}]}}
    obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": kind,
                           "metadata": {"name": name, "namespace": NS},
                           "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec}
    if reserved:
        obj["status"] = {"reservedFor": [{"resource": "pods", "name": n, "uid": f"uid-{n}"} for n in reserved]}
    return obj


def admitted(p: dict[str, Any], snap: Snapshot, policy: Policy = POLICY) -> tuple[Any, dict[str, Any], Any]:
    m = admit.mutate(p, snap, policy)
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = f"uid-{p['metadata']['name']}"
    return m, patched, admit.validate(patched, snap, policy)


def live(p: dict[str, Any], phase: str = "Running") -> dict[str, Any]:
    running = copy.deepcopy(p)
    running["spec"]["nodeName"] = "h1"
    running["status"] = {"phase": phase}
    return running


def held_cluster(*extra: dict[str, Any], gpus: int = 1, phase: str = "Running") -> tuple[Snapshot, dict[str, Any]]:
    """gpu-test3 after pod1 was admitted (and charged the claim's GPU) and runs, holding the claim."""
    _, first, v = admitted(POD1, build_snapshot([NODE, NAMESPACE, quota(gpus), CLAIM]))
    assert v.allowed and v.allocation is not None and v.allocation.gpu_count == 1
    held = copy.deepcopy(CLAIM)
    held["status"] = {"reservedFor": [{"resource": "pods", "name": "pod1", "uid": "uid-pod1"}]}
    return build_snapshot([NODE, NAMESPACE, quota(gpus), held, live(first, phase), *extra]), first


# ------------------------------------------------------------------------------------------ shared claims


def test_the_second_pod_of_a_shared_claim_is_not_charged_its_gpu_again() -> None:
    snap, _ = held_cluster()
    assert snap.namespace_usage[NS].gpus == 1  # the quota (1 GPU) is full with the claim, counted once
    m, patched, v = admitted(POD2, snap)
    assert m.allowed and v.allowed, (m.message, v.message)
    assert v.allocation is None  # nothing reserved: the GPU is the one pod1 already holds
    assert ANNOTATION not in patched["metadata"].get("annotations", {})
    assert "quota" not in m.message and "shared" not in m.reason


def test_a_shared_claim_charges_only_the_pods_own_gpus() -> None:
    snap, _ = held_cluster(claim("own", 1, "ResourceClaimTemplate"), gpus=2)
    both = copy.deepcopy(POD2)
    both["spec"]["resourceClaims"].append({"name": "own", "resourceClaimTemplateName": "own"})
    m, patched, v = admitted(both, snap)
    assert v.allowed and v.allocation is not None and v.allocation.usage().gpus == 1
    assert any("ResourceClaim single-gpu is shared with 1 pod(s)" in w for w in m.warnings)
    # With the quota full, the pod's own GPU is what is refused, not the shared one.
    full, _ = held_cluster(claim("own", 1, "ResourceClaimTemplate"), gpus=1)
    refused = admit.mutate(both, full, POLICY)
    assert not refused.allowed and refused.reason == "quota-exceeded"
    assert "used 1, asked 1, limit 1" in refused.message


def test_a_claim_whose_holders_have_ended_is_charged_to_its_next_pod() -> None:
    # pod1 succeeded: no live pod holds the claim (its reservedFor lags), so pod2 is charged it.
    snap, _ = held_cluster(gpus=1, phase="Succeeded")
    assert snap.namespace_usage.get(NS) is None
    m, _, v = admitted(POD2, snap)
    assert v.allowed and v.allocation is not None and v.allocation.gpu_count == 1
    # And with the quota taken by another claim, it is refused.
    other = claim("other", 1, reserved=("x",))
    holder = live({**copy.deepcopy(POD1), "metadata": {"name": "x", "namespace": NS}})
    holder["spec"]["resourceClaims"] = [{"name": "shared-gpu", "resourceClaimName": "other"}]
    busy, _ = held_cluster(other, holder, gpus=1, phase="Succeeded")
    refused = admit.mutate(POD2, busy, POLICY)
    assert not refused.allowed and refused.reason == "quota-exceeded"


def test_a_shared_claim_still_meets_the_namespaces_model_rules() -> None:
    snap, _ = held_cluster()
    policy = Policy(managed_namespaces="all", namespaces={NS: NamespaceRule(allowed_models=("A100",))})
    decision = admit.mutate(POD2, snap, policy)
    assert not decision.allowed and decision.reason == "dra-model-undecided"


def test_the_holder_of_a_claim_is_judged_as_a_gpu_pod_on_update() -> None:
    # pod1 is live and holds the claim alone: an update (Kueue's nodeSelector) is that of a GPU pod.
    snap, first = held_cluster()
    old = live(first)
    new = copy.deepcopy(old)
    new["spec"]["nodeSelector"] = {"kueue.x-k8s.io/flavor": "h100"}
    assert pod_update(new, old, snap, POLICY).allowed


# ------------------------------------------------------------------------------------------ no GPU in a claim


COMPUTE_DOMAIN, CHANNEL_POD, CHANNEL_TEMPLATE = documents("nvidia-dra-driver-imex-channel-injection.yaml")


def test_a_compute_domain_channel_template_counts_no_gpu_and_passes() -> None:
    namespace = CHANNEL_TEMPLATE["metadata"]["namespace"]
    assert CHANNEL_TEMPLATE["metadata"]["name"] == COMPUTE_DOMAIN["spec"]["channel"]["resourceClaimTemplate"]["name"]
    written = check_claim_object({"operation": "CREATE", "namespace": namespace, "object": CHANNEL_TEMPLATE},
                                 build_snapshot([NODE, quota(0, namespace)]), POLICY)
    assert written.allowed and written.reason == "no-gpu-requested"
    snap = build_snapshot([NODE, quota(0, namespace), CHANNEL_TEMPLATE])
    for decide in (admit.mutate, admit.validate):
        decision = decide(CHANNEL_POD, snap, POLICY)
        assert decision.allowed and decision.allocation is None, decision.message


def test_a_channel_template_not_made_yet_is_refused_until_it_exists() -> None:
    # The pod names a template the ComputeDomain controller has not made yet: its name proves nothing
    # (anyone may later create a GPU template of that name), so the pod waits for it like any claim.
    namespace = CHANNEL_TEMPLATE["metadata"]["namespace"]
    decision = admit.mutate(CHANNEL_POD, build_snapshot([NODE, quota(0, namespace)]), POLICY)
    assert not decision.allowed and (decision.code, decision.reason) == (403, "dra-unknown-claim")
    assert "ResourceClaimTemplate default/imex-channel-0 is not known" in decision.message
    assert "such as a ComputeDomain's channel template, admits the pod once it exists" in decision.message
