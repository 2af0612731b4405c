"""What the API server refuses because of our webhooks, and what it lets through, as a tenant meets it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e.harness import create_namespace, gpu_container, pod, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

NS = "e2e-enforce"
RECORD = "gpu-admission.io/allocation"


@pytest.fixture(scope="module")
def core(admin: client.ApiClient, webhook: Any) -> client.CoreV1Api:
    create_namespace(admin, NS)
    api = client.CoreV1Api(admin)
    api.create_namespaced_resource_quota(
        NS, {"metadata": {"name": "gpu"}, "spec": {"hard": {"requests.nvidia.com/gpu": "3"}}}
    )
    return api


def refusal(call: Any) -> ApiException:
    with pytest.raises(ApiException) as refused:
        call()
    return refused.value


def message(err: ApiException) -> str:
    return str(json.loads(err.body)["message"])


def test_a_pod_past_the_gpu_quota_gets_the_api_servers_403_with_our_message(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("q-two", [gpu_container(2)]))
    err = refusal(lambda: core.create_namespaced_pod(NS, pod("q-one-more", [gpu_container(2)])))
    assert err.status == 403
    text = message(err)
    assert text.startswith('admission webhook "mutate-pods.gpu-admission.io" denied the request')
    assert "requests.nvidia.com/gpu used 2, asked 2, limit 3; ask for at most 1" in text
    # refused by us, before ResourceQuota's own check: nothing stored
    assert refusal(lambda: core.read_namespaced_pod("q-one-more", NS)).status == 404


def test_kubectl_debug_gets_no_gpu_and_may_not_ask_for_one(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("debugged", [{"name": "app", "image": "busybox"}]))
    debug = {"name": "debugger", "image": "busybox", "stdin": True, "tty": True, "targetContainerName": "app"}
    core.patch_namespaced_pod_ephemeralcontainers("debugged", NS, {"spec": {"ephemeralContainers": [debug]}})
    stored = core.read_namespaced_pod("debugged", NS)
    env = {e.name: e.value for e in stored.spec.ephemeral_containers[0].env or ()}
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void"

    forged = {**debug, "name": "forger", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    patch = {"spec": {"ephemeralContainers": [debug, forged]}}
    err = refusal(lambda: core.patch_namespaced_pod_ephemeralcontainers("debugged", NS, patch))
    assert err.status in (400, 403)
    assert "NVIDIA_VISIBLE_DEVICES" in message(err)


def test_the_record_cannot_be_forged_edited_or_removed_by_an_update(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("sealed", [gpu_container(1)]))
    record = core.read_namespaced_pod("sealed", NS).metadata.annotations[RECORD]
    edited = json.loads(record)
    edited["gpus"] = [7]
    for written in ({RECORD: json.dumps(edited)}, {RECORD: None}):
        err = refusal(lambda a=written: core.patch_namespaced_pod("sealed", NS, {"metadata": {"annotations": a}}))
        assert err.status == 403
        assert "validate-pod-records.gpu-admission.io" in message(err)
    # an ordinary label edit of the same pod passes
    core.patch_namespaced_pod("sealed", NS, {"metadata": {"labels": {"team": "x"}}})
    assert core.read_namespaced_pod("sealed", NS).metadata.annotations[RECORD] == record


def test_a_configmap_edit_that_would_widen_a_live_gpu_pod_is_refused(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NS, {"metadata": {"name": "settings"}, "data": {"BATCH": "8"}})
    container = gpu_container(1, name="main")
    container["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    # the quota (3) is held by q-two and sealed: free two GPUs
    core.delete_namespaced_pod("q-two", NS, grace_period_seconds=0)
    wait_for(lambda: not _exists(core, "q-two"), what="q-two deleted")
    core.create_namespaced_pod(NS, pod("reads-settings", [container]))
    err = refusal(lambda: core.patch_namespaced_config_map("settings", NS, {"data": {"NVIDIA_VISIBLE_DEVICES": "all"}}))
    assert err.status == 403
    assert "validate-configmaps.gpu-admission.io" in message(err)
    core.patch_namespaced_config_map("settings", NS, {"data": {"BATCH": "16"}})  # harmless edits pass


def _exists(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, NS)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def test_a_dra_claim_for_every_gpu_is_refused_and_an_exact_count_is_stored(admin: client.ApiClient, core: Any) -> None:
    resource = client.CustomObjectsApi(admin)

    def claim(name: str, request: dict[str, Any]) -> dict[str, Any]:
        spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", **request}}]}}
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}

    with pytest.raises(ApiException) as refused:
        resource.create_namespaced_custom_object(
            "resource.k8s.io", "v1", NS, "resourceclaims", claim("all", {"allocationMode": "All"})
        )
    assert refused.value.status == 403
    assert "validate-resourceclaims.gpu-admission.io" in message(refused.value)
    stored = resource.create_namespaced_custom_object(
        "resource.k8s.io", "v1", NS, "resourceclaims", claim("one", {"allocationMode": "ExactCount", "count": 1})
    )
    assert stored["metadata"]["name"] == "one"


def test_a_quota_raised_in_the_api_is_seen_by_the_watch_and_a_deleted_pod_frees_its_gpus(
    admin: client.ApiClient, core: client.CoreV1Api
) -> None:
    create_namespace(admin, "e2e-watch")
    core.create_namespaced_resource_quota(
        "e2e-watch", {"metadata": {"name": "gpu"}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}
    )
    wait_for(lambda: _created(core, "e2e-watch", "first"), what="the first pod admitted under the new quota")
    assert refusal(lambda: core.create_namespaced_pod("e2e-watch", pod("second", [gpu_container(1)]))).status == 403
    core.patch_namespaced_resource_quota("gpu", "e2e-watch", {"spec": {"hard": {"requests.nvidia.com/gpu": "2"}}})
    wait_for(lambda: _created(core, "e2e-watch", "second"), what="the second pod admitted after the raise")
    assert refusal(lambda: core.create_namespaced_pod("e2e-watch", pod("third", [gpu_container(1)]))).status == 403
    core.delete_namespaced_pod("first", "e2e-watch", grace_period_seconds=0)
    wait_for(lambda: _created(core, "e2e-watch", "third"), what="the third pod admitted once the first is gone")


def _created(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Creates the one-GPU pod `name`; False while the webhook still refuses it (its cache not caught up)."""
    try:
        core.create_namespaced_pod(namespace, pod(name, [gpu_container(1)]))
    except ApiException as err:
        if err.status == 403:
            return False
        raise
    return True


def test_a_pending_pod_that_gains_a_route_to_a_gpu_by_update_is_refused(core: client.CoreV1Api) -> None:
    cuda = {"name": "app", "image": "nvcr.io/nvidia/cuda:12.4.1-base"}
    core.create_namespaced_pod(NS, pod("cpu-later-gpu", [cuda], nodeSelector={"pool": "nowhere"}))
    stored = core.read_namespaced_pod("cpu-later-gpu", NS)
    assert not stored.spec.containers[0].env  # it could reach no GPU node: left as it was
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    err = refusal(lambda: core.patch_namespaced_pod("cpu-later-gpu", NS, {"spec": {"tolerations": [toleration]}}))
    assert err.status == 403
    text = message(err)
    assert "validate-pod-records.gpu-admission.io" in text and "NVIDIA_VISIBLE_DEVICES=void" in text
    # The same toleration given at create: the mutation pins the device variable, and it is admitted.
    core.create_namespaced_pod(NS, pod("cpu-tolerating", [cuda], tolerations=[toleration]))
    env = {e.name: e.value for e in core.read_namespaced_pod("cpu-tolerating", NS).spec.containers[0].env}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "void"}
    # A KAI fraction added later would ask for a GPU nobody counted.
    err = refusal(
        lambda: core.patch_namespaced_pod("cpu-later-gpu", NS, {"metadata": {"annotations": {"gpu-fraction": "0.5"}}})
    )
    assert err.status == 403 and "gpu-fraction" in message(err)
    # Labels and other annotations still pass.
    core.patch_namespaced_pod("cpu-later-gpu", NS, {"metadata": {"labels": {"a": "b"}, "annotations": {"x": "y"}}})


def test_a_review_forged_by_a_tenant_is_refused_and_reserves_nothing(core: client.CoreV1Api, webhook: Any) -> None:
    """Anyone who reaches the webhook's address can post an AdmissionReview; only the API server presents
    the client certificate (its AdmissionConfiguration) that --client-ca accepts."""
    import http.client
    import ssl

    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "forged-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NS,
            "operation": "CREATE",
            "userInfo": {"username": "tenant"},
            "object": {
                **pod("forged", [gpu_container(8)]),
                "metadata": {"name": "forged", "namespace": NS, "uid": "forged-uid"},
            },
        },
    }
    context = ssl.create_default_context(cafile=str(webhook.cert_dir / "ca.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", webhook.port, context=context, timeout=10)
    conn.request("POST", "/validate", body=json.dumps(review), headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    body = json.loads(answer.read())
    conn.close()
    assert (answer.status, body["kind"]) == (403, "Status")
    assert "answer only the API server" in body["message"]
    # nothing held: the namespace can still take what its quota leaves (the test before freed it)
    ledger = f"gpu-admission-ledger-{NS}"
    try:
        entries = core.read_namespaced_config_map(ledger, "gpu-admission").data["reservations"]
    except ApiException as err:
        assert err.status == 404
        entries = "[]"
    assert "forged-uid" not in entries
