"""Every AdmissionReview fixture through the real Flask app and the real core, as the API server would send it.

The fixtures (tests/fixtures/admissionreview/) are public captures and hand-built reviews of each pod shape:
kubectl create, Deployment and Job controller pods (generateName), a server-side dry run, and UPDATEs with
oldObject (`kubectl debug`'s ephemeralcontainers subresource, `kubectl label`). Each one is answered on
/mutate and /validate; each GPU CREATE also goes the API server's way: mutate, apply the patch, then validate.
"""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from flask.testing import FlaskClient
from server_support import FIXTURES, fixture_review, live_app, with_gpu

from webhook.server.source import StaticSource

SCHEMA = "1.30.0"
ALLOCATION = "gpu-admission.io/allocation"


@dataclass(frozen=True)
class Expect:
    operation: str
    gpu: bool  # the pod asks for GPUs, so a CREATE of it is decided (patched, or denied unmutated)


EXPECTED = {
    # Public captures (none asks for a GPU).
    "pod-create-docs-example.kyverno-docs.json": Expect("CREATE", gpu=False),
    "pod-create-kubectl-mutating-phase.appscope.json": Expect("CREATE", gpu=False),
    "pod-create-kubectl-validating-phase.request-only.kubewarden.json": Expect("CREATE", gpu=False),
    "pod-create-replicaset-controller-eks.connaisseur.json": Expect("CREATE", gpu=False),
    # Hand-built, as a v1.30 API server sends them.
    "pod-create-kubectl.mutating.json": Expect("CREATE", gpu=True),
    "pod-create-replicaset-controller.mutating.json": Expect("CREATE", gpu=True),
    "pod-create-job-controller.mutating.json": Expect("CREATE", gpu=True),
    "pod-create-kubectl-dry-run-server.mutating.json": Expect("CREATE", gpu=True),
    "pod-update-ephemeralcontainers-kubectl-debug.json": Expect("UPDATE", gpu=True),
    "pod-update-metadata-kubectl-label.json": Expect("UPDATE", gpu=True),
}
NAMES = sorted(EXPECTED)
CREATES = [name for name in NAMES if EXPECTED[name].operation == "CREATE"]
UPDATES = [name for name in NAMES if EXPECTED[name].operation == "UPDATE"]
# `kubectl debug`: the containers it adds are decided (tests/admission/test_isolation.py); other UPDATEs are not.
EPHEMERAL = "pod-update-ephemeralcontainers-kubectl-debug.json"
ENDPOINTS = ("/mutate", "/validate")


def post(client: FlaskClient, endpoint: str, review: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(endpoint, data=json.dumps(review), content_type="application/json")
    assert answer.status_code == 200, answer.get_data(as_text=True)
    body: dict[str, Any] = json.loads(answer.get_data())
    assert (body["apiVersion"], body["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert set(body) == {"apiVersion", "kind", "response"}
    assert body["response"]["uid"] == review["request"]["uid"]
    return body["response"]  # type: ignore[no-any-return]


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def as_validating(review: dict[str, Any], pod: dict[str, Any], pod_uid: str) -> dict[str, Any]:
    """What the API server sends validating webhooks after mutation: the patched pod with the fields its
    create strategy sets (uid, creationTimestamp, the generated name, status) and request.name filled in."""
    result = copy.deepcopy(review)
    pod = copy.deepcopy(pod)
    metadata = pod["metadata"]
    metadata.setdefault("name", metadata.get("generateName", "") + "q8z4x")
    metadata["uid"] = pod_uid
    metadata["creationTimestamp"] = "2026-11-20T16:00:00Z"
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod)}
    result["request"]["object"] = pod
    result["request"]["name"] = metadata["name"]
    return result


def qos_class(pod: dict[str, Any]) -> str:
    """Kubernetes' QoS class, from cpu and memory only (extended resources such as GPUs never count)."""
    containers = pod["spec"]["containers"]
    pairs = [(c.get("resources", {}).get("limits", {}), c.get("resources", {}).get("requests", {})) for c in containers]
    if not any(r in limits or r in requests for limits, requests in pairs for r in ("cpu", "memory")):
        return "BestEffort"
    guaranteed = all(
        r in limits and limits[r] == requests.get(r, limits[r]) for limits, requests in pairs for r in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


def test_every_fixture_on_disk_has_an_expectation_and_every_expectation_a_file() -> None:
    on_disk = sorted(p.name for p in FIXTURES.glob("*.json"))
    assert on_disk == NAMES
    assert (FIXTURES / "README.md").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_fixtures_are_valid_pods_of_the_operation_they_claim(name: str) -> None:
    request = fixture_review(name)["request"]
    assert request["operation"] == EXPECTED[name].operation
    assert ("nvidia.com/gpu" in json.dumps(request["object"])) == EXPECTED[name].gpu
    kubernetes_validate.validate(request["object"], SCHEMA, strict=True)
    if request["operation"] == "UPDATE":
        old = request["oldObject"]
        kubernetes_validate.validate(old, SCHEMA, strict=True)
        assert old["metadata"]["uid"] == request["object"]["metadata"]["uid"] and old != request["object"]
    else:
        assert request.get("oldObject") in (None, {})


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("name", NAMES)
def test_each_fixture_gets_the_answer_its_shape_calls_for(
    name: str, endpoint: str, live_client: FlaskClient, live_source: StaticSource
) -> None:
    client, source = live_client, live_source
    review = fixture_review(name)
    response = post(client, endpoint, review)
    decided = EXPECTED[name].operation == "CREATE" and EXPECTED[name].gpu
    if name == EPHEMERAL:  # the debug container gets NVIDIA_VISIBLE_DEVICES=void, and lacks it until then
        if endpoint == "/mutate":
            assert patch_of(response) == [
                {
                    "op": "add",
                    "path": "/spec/ephemeralContainers/0/env",
                    "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
                }
            ]
        else:
            assert (response["allowed"], response["status"]["reason"]) == (False, "gpu-reachable")
    elif not decided:  # no GPU, or not a CREATE: allowed untouched
        assert response == {"uid": review["request"]["uid"], "allowed": True}
    elif endpoint == "/mutate":
        assert response["allowed"] is True and "status" not in response
        patched = jsonpatch.apply_patch(review["request"]["object"], patch_of(response))
        kubernetes_validate.validate(patched, SCHEMA, strict=True)
        assert ALLOCATION in patched["metadata"]["annotations"]
        # Ownership and naming are the controllers' and the API server's, never the webhook's.
        for key in ("name", "generateName", "namespace", "ownerReferences", "finalizers"):
            assert patched["metadata"].get(key) == review["request"]["object"]["metadata"].get(key)
    else:  # a GPU pod that never went through /mutate is refused at /validate
        assert response["allowed"] is False and "patch" not in response
        assert (response["status"]["code"], response["status"]["reason"]) == (403, "not-mutated")
    assert source.reservations() == {}


@pytest.mark.parametrize("name", CREATES)
def test_a_gpu_create_is_mutated_then_validated_and_reserved_unless_a_dry_run(
    name: str, live_client: FlaskClient, live_source: StaticSource
) -> None:
    client, source = live_client, live_source
    review = fixture_review(name) if EXPECTED[name].gpu else with_gpu(fixture_review(name), 2)
    mutated = post(client, "/mutate", review)
    pod = jsonpatch.apply_patch(review["request"]["object"], patch_of(mutated))
    pod_uid = pod["metadata"].get("uid") or "0f9e8d7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f"

    validated = post(client, "/validate", as_validating(review, pod, pod_uid))

    assert validated == {"uid": review["request"]["uid"], "allowed": True}
    dry_run = review["request"].get("dryRun", review.get("dryRun")) is True
    assert list(source.reservations()) == ([] if dry_run else [pod_uid])


def test_the_dry_run_fixture_reserves_once_sent_for_real(live_client: FlaskClient, live_source: StaticSource) -> None:
    name = "pod-create-kubectl-dry-run-server.mutating.json"
    review = fixture_review(name)
    assert review["request"]["dryRun"] is True and review["request"]["options"]["dryRun"] == ["All"]
    client, source = live_client, live_source
    pod = jsonpatch.apply_patch(review["request"]["object"], patch_of(post(client, "/mutate", review)))
    validating = as_validating(review, pod, "3e2d1c0b-9a8f-4e7d-8c6b-5a4f3e2d1c0b")
    assert post(client, "/validate", validating)["allowed"] is True
    assert source.reservations() == {}
    validating["request"]["dryRun"] = False
    assert post(client, "/validate", validating)["allowed"] is True
    assert list(source.reservations()) == ["3e2d1c0b-9a8f-4e7d-8c6b-5a4f3e2d1c0b"]


@pytest.mark.parametrize("name", [n for n in UPDATES if n != EPHEMERAL])  # a debug container is decided
def test_updates_are_never_judged_even_of_a_pod_no_node_could_hold(name: str) -> None:
    impossible = with_gpu(fixture_review(name), 64)  # more GPUs than any node: a CREATE of it is refused
    as_create = copy.deepcopy(impossible)
    as_create["request"].update(operation="CREATE", oldObject=None)
    for key in ("subResource", "requestSubResource"):
        as_create["request"].pop(key, None)
    for endpoint in ENDPOINTS:
        client, _source = live_app()  # a fresh server per endpoint
        assert post(client, endpoint, impossible) == {"uid": impossible["request"]["uid"], "allowed": True}
        assert post(client, endpoint, as_create)["allowed"] is False


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("name", NAMES)
def test_the_answer_does_not_depend_on_request_kind_resource_or_subresource(
    name: str, endpoint: str, live_client: FlaskClient
) -> None:
    """API servers before 1.15 and hand-converted captures leave them out (the connaisseur capture does)."""
    review = fixture_review(name)
    bare = copy.deepcopy(review)
    for key in ("requestKind", "requestResource", "requestSubResource"):
        bare["request"].pop(key, None)
    assert bare != review or name == "pod-create-replicaset-controller-eks.connaisseur.json"
    client = live_client  # one server: it seals its decision records with its own key
    assert post(client, endpoint, bare) == post(client, endpoint, review)
