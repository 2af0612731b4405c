"""Several serve replicas behind one URL share a quota exactly; with every replica down each webhook does
what its failurePolicy says (docs/install.md, "Failure policy"). Runs last: it scales the shared webhook."""

from __future__ import annotations

import json
import re
import threading

import pytest
from e2e.harness import NAMESPACE, Replica, Webhook, api_client, create_namespace, gpu_container, pod
from kubernetes import client
from kubernetes.client.rest import ApiException

QUOTA = 4


@pytest.fixture(scope="module")
def core(admin: client.ApiClient, webhook: Webhook) -> client.CoreV1Api:
    yield client.CoreV1Api(admin)
    webhook.scale(1)


def burst(webhook: Webhook, namespace: str, count: int) -> tuple[list[str], list[str]]:
    """Creates `count` one-GPU pods at once from as many threads; returns (created, refusal messages)."""
    created: list[str] = []
    refused: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(count)

    def create(i: int) -> None:
        api = client.CoreV1Api(api_client(webhook.plane.admin_kubeconfig))
        start.wait()
        try:
            api.create_namespaced_pod(namespace, pod(f"p{i}", [gpu_container(1)]))
            with lock:
                created.append(f"p{i}")
        except ApiException as err:
            with lock:
                refused.append(f"{err.status} {json.loads(err.body)['message']}")

    threads = [threading.Thread(target=create, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return created, refused


def answered(webhook: Webhook, replica: Replica) -> float:
    """Admissions this replica has answered (its /validate requests, from its own /metrics)."""
    pattern = re.compile(r'^gpu_admission_admission_duration_seconds_count\{endpoint="validate"[^}]*\} (\S+)$', re.M)
    return sum(float(n) for n in pattern.findall(webhook.metrics([replica])))


@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_share_a_quota_exactly(
    admin: client.ApiClient, core: client.CoreV1Api, webhook: Webhook, replicas: int
) -> None:
    webhook.scale(replicas)
    # The API server reuses its kept-alive connections, and the kernel spreads only new ones over the
    # replicas: a burst may now and then reach one replica alone. Such a burst proves nothing about
    # sharing, so it is repeated in a fresh namespace (each must hold its quota exactly either way).
    spread: list[list[float]] = []
    for attempt in range(4):
        namespace = f"e2e-shared-{replicas}-{attempt}"
        create_namespace(admin, namespace)
        core.create_namespaced_resource_quota(
            namespace, {"metadata": {"name": "gpu"}, "spec": {"hard": {"requests.nvidia.com/gpu": str(QUOTA)}}}
        )
        before = [answered(webhook, r) for r in webhook.replicas]
        created, refused = burst(webhook, namespace, 16)
        spread.append([answered(webhook, r) - b for r, b in zip(webhook.replicas, before, strict=True)])
        assert len(created) == QUOTA, refused
        # every refusal is ours: none reached the API server's own ResourceQuota check, which would have
        # caught a quota our replicas together over-admitted
        assert len(refused) == 16 - QUOTA
        for text in refused:
            assert 'gpu-admission.io" denied the request' in text and "ResourceQuota" in text, text
            assert "exceeded quota" not in text, text
        stored = core.list_namespaced_pod(namespace).items
        assert sorted(p.metadata.name for p in stored) == sorted(created)
        assert all("gpu-admission.io/allocation" in p.metadata.annotations for p in stored)
        if sum(1 for n in spread[-1] if n) >= 2:
            return
    raise AssertionError(f"no burst reached two replicas: admissions per replica in each {spread}")


def test_a_deleted_ledger_heals_at_the_next_admission(
    admin: client.ApiClient, core: client.CoreV1Api, webhook: Webhook
) -> None:
    namespace = "e2e-heal"
    create_namespace(admin, namespace)
    webhook.scale(2)
    ledger = f"gpu-admission-ledger-{namespace}"
    core.create_namespaced_pod(namespace, pod("before", [gpu_container(1)]))
    assert core.read_namespaced_config_map(ledger, NAMESPACE).data["reservations"]
    core.delete_namespaced_config_map(ledger, NAMESPACE)
    for i in range(4):  # whichever replica answers, none is stuck on the deleted object
        core.create_namespaced_pod(namespace, pod(f"after-{i}", [gpu_container(1)]))
    uids = {core.read_namespaced_pod(f"after-{i}", namespace).metadata.uid for i in range(4)}
    written = {e["uid"] for e in json.loads(core.read_namespaced_config_map(ledger, NAMESPACE).data["reservations"])}
    assert written & uids  # the ledger exists again, holding admissions made after the deletion


def test_with_every_replica_down_gpu_pods_wait_and_other_pods_pass(
    admin: client.ApiClient, core: client.CoreV1Api, webhook: Webhook
) -> None:
    create_namespace(admin, "e2e-outage")
    create_namespace(admin, "e2e-outage-off", managed=False)
    webhook.scale(0)
    try:
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod("e2e-outage", pod("gpu", [gpu_container(1)]))
        # mutating (Ignore) is skipped, validating (Fail) refuses: the GPU pod waits for the webhook
        assert refused.value.status == 500
        text = json.loads(refused.value.body)["message"]
        assert 'failed calling webhook "validate-pods.gpu-admission.io"' in text
        # a pod that cannot be a GPU pod never reaches the webhook (matchConditions), nor does any pod of a
        # namespace that is not opted in
        core.create_namespaced_pod("e2e-outage", pod("cpu", [{"name": "main", "image": "busybox"}]))
        core.create_namespaced_pod("e2e-outage-off", pod("gpu", [gpu_container(1)]))
        # label edits of a running GPU pod pass: the record webhook sees only record edits
        core.patch_namespaced_pod("cpu", "e2e-outage", {"metadata": {"labels": {"edited": "yes"}}})
    finally:
        webhook.scale(1)
    core.create_namespaced_pod("e2e-outage", pod("gpu", [gpu_container(1)]))
    stored = core.read_namespaced_pod("gpu", "e2e-outage")
    assert "gpu-admission.io/allocation" in stored.metadata.annotations
