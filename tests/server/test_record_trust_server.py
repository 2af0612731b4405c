"""The server end of record trust and fast paths: a real Flask app with the real core, compared with
what `check` (admit.mutate then admit.validate, no requester) answers for the same pod."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
from flask.testing import FlaskClient
from server_support import cluster_objects, gpu_pod_review

from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import Policy
from webhook.server.app import ServerConfig, create_app
from webhook.server.review import decode_patch
from webhook.server.source import StaticSource

SNAPSHOT = build_snapshot(cluster_objects())
FORGED = json.dumps({"version": 1, "node": "gpu-a", "gpus": [0], "gpuCount": 1, "memoryMiB": 0, "cores": 0,
                     "vendor": "nvidia", "topology": "single"})


def client(key: bytes | None = b"r" * 32) -> FlaskClient:
    return create_app(ServerConfig(source=StaticSource(SNAPSHOT), record_key=key)).test_client()


def answer(c: FlaskClient, endpoint: str, review: dict[str, Any]) -> dict[str, Any]:
    response = c.post(f"/{endpoint}", data=json.dumps(review), content_type="application/json")
    assert response.status_code == 200
    result: dict[str, Any] = response.get_json()["response"]
    return result


def mutated(c: FlaskClient, review: dict[str, Any]) -> dict[str, Any]:
    """The review the validating webhook gets: the pod after the server's patch, with its UID."""
    result = answer(c, "mutate", review)
    assert result["allowed"], result
    final = copy.deepcopy(review)
    final["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"], decode_patch(result))
    final["request"]["object"]["metadata"]["uid"] = "pod-1"
    final["request"]["dryRun"] = True
    return final


def test_the_server_overwrites_a_forged_record_and_refuses_a_hand_made_final_pod() -> None:
    c = client()
    forged = gpu_pod_review()
    forged["request"]["object"]["metadata"]["annotations"] = {ANNOTATION: FORGED}
    final = mutated(c, forged)
    record = json.loads(final["request"]["object"]["metadata"]["annotations"][ANNOTATION])
    assert (record["memoryMiB"], record["cores"]) == (81559, 100)  # a whole H100, as without the record
    assert final["request"]["object"]["spec"]["containers"][0]["env"] == [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "81559m"}]
    assert answer(c, "validate", final)["allowed"]
    # The same final pod written by hand, record and limits lifted, never went through the webhook.
    by_hand = copy.deepcopy(final)
    by_hand["request"]["object"]["metadata"]["annotations"][ANNOTATION] = FORGED
    by_hand["request"]["object"]["spec"]["containers"][0]["env"] = [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "0m"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]
    refused = answer(c, "validate", by_hand)
    assert (refused["allowed"], refused["status"]["code"], refused["status"]["reason"]) == (
        False, 403, "annotation-not-sealed")


def test_replicas_sharing_the_key_verify_each_others_records_and_others_do_not() -> None:
    final = mutated(client(b"r" * 32), gpu_pod_review())
    assert answer(client(b"r" * 32), "validate", final)["allowed"]
    other = answer(client(b"s" * 32), "validate", final)
    assert (other["allowed"], other["status"]["reason"]) == (False, "annotation-not-sealed")
    # Re-invocation on the same replica (or one with the same key): no patch at all.
    again = copy.deepcopy(final)
    del again["request"]["dryRun"]
    assert answer(client(b"r" * 32), "mutate", again) == {"uid": "r-1", "allowed": True}


def mirror_review(username: str, node: str = "gpu-a") -> dict[str, Any]:
    review = gpu_pod_review()
    review["request"]["object"]["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    review["request"]["object"]["spec"]["nodeName"] = node
    review["request"]["userInfo"] = {"username": username}
    return review


def check_answer(review: dict[str, Any]) -> tuple[bool, str]:
    """What `gpu-admission check` answers for the review's pod: mutate, patch, validate."""
    pod = review["request"]["object"]
    m = admit.mutate(pod, SNAPSHOT, Policy(), namespace="team-a")
    if not m.allowed:
        return False, m.reason
    v = admit.validate(jsonpatch.apply_patch(pod, [dict(op) for op in m.patch]), SNAPSHOT, Policy(), namespace="team-a")
    return v.allowed, v.reason


def test_a_mirror_annotation_from_anyone_but_the_pods_node_is_decided_like_check_decides_it() -> None:
    c = client()
    for username in ("alice", "system:node:gpu-b", "system:serviceaccount:team-a:default", "system:node:"):
        review = mirror_review(username)
        server = answer(c, "mutate", review)
        assert (server["allowed"], server["status"]["reason"]) == (False, "node-name-set") == check_answer(review)
        server = answer(c, "validate", review)
        assert (server["allowed"], server["status"]["reason"]) == (False, "node-name-set")


def test_the_kubelet_of_the_pods_own_node_creates_its_mirror_pod() -> None:
    c = client()
    review = mirror_review("system:node:gpu-a")
    for endpoint in ("mutate", "validate"):
        assert answer(c, endpoint, review) == {"uid": "r-1", "allowed": True}
