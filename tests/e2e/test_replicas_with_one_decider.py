"""Replicas that elect one decider (`--reservations leader`): the others forward every review to it, a
quota holds exactly under a burst spread over all of them, and a decider killed mid-burst is replaced
by another that waits out its answers before deciding."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator

import pytest
from e2e.harness import NAMESPACE, Replica, Webhook, create_namespace, gpu_container, pod, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

LEASE = "gpu-admission-decider"


@pytest.fixture(scope="module")
def core(admin: client.ApiClient, webhook: Webhook) -> Iterator[client.CoreV1Api]:
    webhook.scale(3, "leader")
    api = client.CoreV1Api(admin)
    yield api
    webhook.scale(1, "api")
    for namespace in api.list_namespace().items:  # no kubelet confirms a deletion: forced, freeing the nodes
        if namespace.metadata.name.startswith("e2e-decider"):
            api.delete_collection_namespaced_pod(namespace.metadata.name, grace_period_seconds=0)


def decider(admin: client.ApiClient, webhook: Webhook) -> Replica:
    """The replica the Lease names, by the URL it publishes there."""
    lease = client.CoordinationV1Api(admin).read_namespaced_lease(LEASE, NAMESPACE)
    url = lease.metadata.annotations["gpu-admission.io/peer"]
    return next(r for r in webhook.replicas if url.endswith(f":{r.port}"))


def forwarded(webhook: Webhook, replica: Replica) -> float:
    pattern = re.compile(r'^gpu_admission_forwarded_total\{[^}]*code="200"[^}]*\} (\S+)$', re.M)
    return sum(float(n) for n in pattern.findall(webhook.metrics([replica])))


def burst(admin: client.ApiClient, namespace: str, names: list[str]) -> tuple[list[str], list[str]]:
    created: list[str] = []
    refused: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(len(names))

    def create(name: str) -> None:
        api = client.CoreV1Api(admin)
        start.wait()
        try:
            api.create_namespaced_pod(namespace, pod(name, [gpu_container(1)]))
            with lock:
                created.append(name)
        except ApiException as err:
            with lock:
                refused.append(f"{err.status} {json.loads(err.body)['message']}")

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return created, refused


def quota(core: client.CoreV1Api, admin: client.ApiClient, namespace: str, gpus: int) -> None:
    create_namespace(admin, namespace)
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "gpu"}, "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}}})


def test_followers_forward_to_one_decider_and_a_quota_holds_exactly(
    admin: client.ApiClient, core: client.CoreV1Api, webhook: Webhook
) -> None:
    leader = decider(admin, webhook)
    followers = [r for r in webhook.replicas if r is not leader]
    before = sum(forwarded(webhook, r) for r in followers)
    for attempt in range(4):  # kept-alive connections may send a whole burst to one replica: retried
        namespace = f"e2e-decider-{attempt}"
        quota(core, admin, namespace, 4)
        created, refused = burst(admin, namespace, [f"p{i}" for i in range(16)])
        assert len(created) == 4, refused
        assert len(refused) == 12
        for text in refused:
            assert 'gpu-admission.io" denied the request' in text and "ResourceQuota" in text, text
        stored = core.list_namespaced_pod(namespace).items
        assert sorted(p.metadata.name for p in stored) == sorted(created)
        if sum(forwarded(webhook, r) for r in followers) > before:
            break
    else:
        raise AssertionError("no review reached a follower in four bursts")
    assert forwarded(webhook, leader) == 0  # the decider decides itself
    # Nothing per pod is written to the API: no ledger ConfigMap for these namespaces.
    maps = {m.metadata.name for m in core.list_namespaced_config_map(NAMESPACE).items}
    assert not {m for m in maps if m.startswith("gpu-admission-ledger-e2e-decider")}


def test_a_decider_killed_mid_burst_is_replaced_and_no_quota_is_overrun(
    admin: client.ApiClient, core: client.CoreV1Api, webhook: Webhook
) -> None:
    namespace = "e2e-decider-kill"
    quota(core, admin, namespace, 6)
    old = decider(admin, webhook)
    results: list[tuple[str, bool]] = []
    refusals: list[str] = []
    stop = threading.Event()

    def keep_creating() -> None:
        api = client.CoreV1Api(admin)
        for i in range(400):
            if stop.is_set():
                return
            try:
                api.create_namespaced_pod(namespace, pod(f"k{i}", [gpu_container(1)]))
                results.append((f"k{i}", True))
            except ApiException as err:
                results.append((f"k{i}", False))
                refusals.append(f"{err.status} {json.loads(err.body).get('message', '')}"[:240])
            time.sleep(0.3)

    creator = threading.Thread(target=keep_creating)
    creator.start()
    try:
        time.sleep(1.0)
        old.process.kill()  # no goodbye: its Lease must lapse
        webhook.replicas.remove(old)
        killed_at = time.monotonic()
        new = wait_for(lambda: _deciding_other(admin, webhook, old), timeout=60, what="a new decider")
        took = time.monotonic() - killed_at
        # after the hand-over the new decider admits again, up to the quota
        wait_for(lambda: len(core.list_namespaced_pod(namespace).items) >= 6, timeout=60,
                 what=f"the quota filled after the hand-over; refusals {refusals[:2]} ... {refusals[-2:]}")
        time.sleep(2.0)  # creates past the quota, refused
    finally:
        stop.set()
        creator.join(30)
    stored = core.list_namespaced_pod(namespace).items
    assert len(stored) == 6  # never more than the quota, across the hand-over
    assert sorted(p.metadata.name for p in stored) == sorted(n for n, ok in results if ok)
    assert new is not old and took < 40
    # while no replica decided, creates were refused (503 through the API server), never admitted unchecked
    assert any("failed calling webhook" in text or "decider" in text for text in refusals), refusals[:3]
    webhook.start_replica()  # back to three for the next test


def _deciding_other(admin: client.ApiClient, webhook: Webhook, old: Replica) -> Replica | None:
    try:
        found = decider(admin, webhook)
    except (StopIteration, ApiException):
        return None
    return found if found is not old and "deciding" in _ready_text(webhook, found) else None


def _ready_text(webhook: Webhook, replica: Replica) -> str:
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=str(webhook.cert_dir / "ca.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", replica.port, context=context, timeout=5)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().read().decode()
    except OSError:
        return ""
    finally:
        conn.close()
