"""Pods through the real API server: what it stored after our webhooks, read back from the API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e.harness import create_namespace, gpu_container, pod, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

RECORD = "gpu-admission.io/allocation"


@pytest.fixture(scope="module")
def core(admin: client.ApiClient, webhook: Any) -> client.CoreV1Api:
    create_namespace(admin, "e2e-pods")
    create_namespace(admin, "e2e-unmanaged", managed=False)
    return client.CoreV1Api(admin)


def env_of(container: Any) -> dict[str, str]:
    return {e.name: e.value for e in container.env or ()}


def test_a_gpu_pod_is_stored_with_its_limits_toleration_affinity_and_sealed_record(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("e2e-pods", pod("one-gpu", [gpu_container(1, **{"nvidia.com/gpumem": "20000"})]))
    stored = core.read_namespaced_pod("one-gpu", "e2e-pods")

    record = json.loads(stored.metadata.annotations[RECORD])
    assert record["gpuCount"] == 1
    env = env_of(stored.spec.containers[0])
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"].startswith("20000")
    assert any(t.key == "nvidia.com/gpu" for t in stored.spec.tolerations)
    bound = wait_for(lambda: core.read_namespaced_pod("one-gpu", "e2e-pods").spec.node_name, what="binding")
    assert bound == record["node"]


def test_a_pod_in_an_unmanaged_namespace_is_stored_as_sent(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("e2e-unmanaged", pod("plain", [gpu_container(1)]))
    stored = core.read_namespaced_pod("plain", "e2e-unmanaged")
    assert RECORD not in (stored.metadata.annotations or {})
    assert not stored.spec.containers[0].env


def test_server_dry_run_answers_and_stores_nothing(core: client.CoreV1Api) -> None:
    answer = core.create_namespaced_pod("e2e-pods", pod("dry", [gpu_container(1)]), dry_run="All")
    assert RECORD in answer.metadata.annotations
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("dry", "e2e-pods")
    assert missing.value.status == 404
