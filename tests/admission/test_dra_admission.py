"""ResourceClaim and ResourceClaimTemplate writes, and pods naming claims, through the real server and core."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from builders import H100, node, snapshot
from flask.testing import FlaskClient

from webhook.core.admission.dra_objects import check_claim_object
from webhook.core.domain.model import QuotaLimits
from webhook.core.policy.model import NamespaceRule, Policy
from webhook.policyfile.holder import PolicyHolder
from webhook.server.admission import real_core
from webhook.server.app import ServerConfig, create_app
from webhook.server.source import StaticSource

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dra"
CLAIMS = {d["metadata"]["name"]: d for d in yaml.safe_load_all((FIXTURES / "claims.yaml").read_text()) if d}
SNAP = snapshot(node("h1", H100, 8), quotas={"team-a": (QuotaLimits("gpu-quota", gpus=4),)})
POLICY = Policy(namespaces={"team-a": NamespaceRule(max_gpus_per_pod=8)})


def client(policy: Policy = POLICY) -> FlaskClient:
    config = ServerConfig(source=StaticSource(SNAP), namespace="gpu-admission", core=real_core(),
                          policy=PolicyHolder(None, loader=lambda _path: policy))
    return create_app(config).test_client()


def review(obj: dict[str, Any], *, operation: str = "CREATE", old: dict[str, Any] | None = None,
           namespace: str = "team-a") -> dict[str, Any]:
    kind = obj["kind"]
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}.get(kind, "pods")
    group = "" if kind == "Pod" else "resource.k8s.io"
    request: dict[str, Any] = {
        "uid": "u1",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": plural},
        "namespace": namespace,
        "operation": operation,
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def answer(c: FlaskClient, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    response = c.post(endpoint, data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    result: dict[str, Any] = response.get_json()["response"]
    return result


def test_claims_that_can_never_be_counted_are_refused_when_written() -> None:
    c = client()
    for name, reason in (("every-gpu", "dra-all-devices"), ("gpu-monitor", "dra-admin-access")):
        got = answer(c, "/validate", review(CLAIMS[name]))
        assert got["allowed"] is False and got["status"]["code"] == 403 and got["status"]["reason"] == reason
    template = CLAIMS["gpu-claim-template"]
    assert answer(c, "/validate", review(template))["allowed"] is True
    assert answer(c, "/validate", review(CLAIMS["nic"]))["allowed"] is True


def test_a_claim_above_the_quota_or_the_per_pod_maximum_is_refused() -> None:
    big = copy.deepcopy(CLAIMS["gpu-claim-template"])
    big["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 6
    got = answer(client(), "/validate", review(big))
    assert got["allowed"] is False and got["status"]["reason"] == "quota-exceeded"
    assert "asks for 6 GPUs, above ResourceQuota team-a/gpu-quota" in got["status"]["message"]
    strict = Policy(namespaces={"team-a": NamespaceRule(max_gpus_per_pod=1)})
    got = answer(client(strict), "/validate", review(CLAIMS["gpu-claim-template"]))
    assert got["allowed"] is False and got["status"]["reason"] == "max-gpus-per-pod"


def test_claim_writes_elsewhere_are_let_through() -> None:
    c = client()
    every = CLAIMS["every-gpu"]
    assert answer(c, "/mutate", review(every))["allowed"] is True  # only the validating webhook decides
    assert answer(c, "/validate", review(every, namespace="sandbox"))["allowed"] is True  # unmanaged
    assert answer(c, "/validate", review(every, namespace="kube-system"))["allowed"] is True
    # A metadata-only update (a finalizer) of a claim written before the namespace was managed.
    finalised = copy.deepcopy(every)
    finalised["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    assert answer(c, "/validate", review(finalised, operation="UPDATE", old=every))["allowed"] is True
    assert answer(c, "/validate", review(every, operation="DELETE"))["allowed"] is True


def test_a_malformed_claim_is_refused_naming_the_field() -> None:
    broken = copy.deepcopy(CLAIMS["mig-1g"])
    broken["spec"]["devices"]["requests"][0]["exactly"]["count"] = "two"
    decision = check_claim_object({"operation": "CREATE", "namespace": "team-a", "object": broken}, SNAP, POLICY)
    assert not decision.allowed and decision.code == 422
    assert decision.message.startswith("ResourceClaim: spec.devices.requests[0].exactly.count: ")


def test_a_pod_with_only_a_claim_reaches_the_core_and_is_refused_when_uncountable() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
           "spec": {"containers": [{"name": "c", "image": "cuda", "resources": {"claims": [{"name": "g"}]}}],
                    "resourceClaims": [{"name": "g", "resourceClaimName": "every-gpu"}]}}
    got = answer(client(), "/mutate", review(pod))
    # The claim is not in the snapshot: its GPUs cannot be counted, so the pod is refused, not waved through.
    assert got["allowed"] is False and got["status"]["reason"] == "dra-unknown-claim"
