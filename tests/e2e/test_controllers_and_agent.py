"""Pods the controller-manager makes, a group placed in one NVLink clique, and the node agent's
GPUInventory written with the agent's own RBAC."""

from __future__ import annotations

import json
from typing import Any

import fake_nvml
import pytest
from e2e.harness import NAMESPACE, RELEASE, create_namespace, create_node, gpu_container, pod, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

from webhook.agent.discovery import discover
from webhook.agent.publish import InventoryPublisher, PublishError, inventory_status

NS = "e2e-workloads"
RECORD = "gpu-admission.io/allocation"
CLIQUE = "nvidia.com/gpu.clique"
GB200 = "NVIDIA-GB200"


def gb200_node(name: str, clique: str) -> dict[str, Any]:
    capacity = {"cpu": "144", "memory": "900Gi", "pods": "110", "nvidia.com/gpu": "4"}
    labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": GB200,
        "nvidia.com/gpu.memory": "189471",
        "nvidia.com/gpu.count": "4",
        CLIQUE: clique,
    }
    return {"metadata": {"name": name, "labels": labels}, "status": {"capacity": capacity, "allocatable": capacity}}


@pytest.fixture(scope="module")
def core(admin: client.ApiClient, webhook: Any) -> client.CoreV1Api:
    create_namespace(admin, NS)
    for i in range(4):
        create_node(admin, gb200_node(f"gb-{i}", f"fabric.{i // 2}"))
    return client.CoreV1Api(admin)


def pods_of(core: client.CoreV1Api, selector: str, count: int) -> list[Any]:
    def listed() -> list[Any] | None:
        found = core.list_namespaced_pod(NS, label_selector=selector).items
        return found if len(found) == count and all(p.spec.node_name for p in found) else None

    return list(wait_for(listed, timeout=60, what=f"{count} bound pods of {selector}"))


def record_of(stored: Any) -> dict[str, Any]:
    return dict(json.loads(stored.metadata.annotations[RECORD]))


def test_a_deployment_and_a_job_get_one_allocation_per_pod(admin: client.ApiClient, core: client.CoreV1Api) -> None:
    template = {
        "metadata": {"labels": {"app": "serve"}},
        "spec": {"containers": [gpu_container(1, **{"nvidia.com/gpumem": "10000"})]},
    }
    client.AppsV1Api(admin).create_namespaced_deployment(
        NS,
        {
            "metadata": {"name": "serve"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "serve"}}, "template": template},
        },
    )
    job_template = {"metadata": {"labels": {"app": "batch"}}, "spec": {**template["spec"], "restartPolicy": "Never"}}
    client.BatchV1Api(admin).create_namespaced_job(
        NS, {"metadata": {"name": "batch"}, "spec": {"parallelism": 2, "completions": 2, "template": job_template}}
    )
    for selector, count in (("app=serve", 3), ("app=batch", 2)):
        for stored in pods_of(core, selector, count):
            record = record_of(stored)
            assert record["gpuCount"] == 1 and record["memoryMiB"] == 10000
            # The record's node is the webhook's first choice; the required term is what binds the scheduler,
            # whose default topology spread may send replicas of one controller to other nodes of that set.
            assert _node_allowed(core, stored)
            env = {e.name: e.value for e in stored.spec.containers[0].env}
            assert env["CUDA_DEVICE_MEMORY_LIMIT_0"].startswith("10000")


def _node_allowed(core: client.CoreV1Api, stored: Any) -> bool:
    labels = core.read_node(stored.spec.node_name).metadata.labels
    terms = stored.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    return any(
        all(labels.get(e.key) in e.values for e in term.match_expressions if e.operator == "In") for term in terms
    )


def test_the_pods_of_one_jobset_land_in_one_clique(core: client.CoreV1Api) -> None:
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "train",
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "2",
    }
    for i in range(2):
        body = pod(
            f"train-workers-{i}",
            [gpu_container(4)],
            metadata={"labels": {**labels, "jobset.sigs.k8s.io/job-index": str(i), "job": "train"}},
            nodeSelector={"nvidia.com/gpu.product": GB200},
        )
        core.create_namespaced_pod(NS, body)
    bound = pods_of(core, "job=train", 2)
    nodes = {p.spec.node_name for p in bound}
    assert len(nodes) == 2
    cliques = {core.read_node(n).metadata.labels[CLIQUE] for n in nodes}
    assert len(cliques) == 1, f"one group spread over cliques {cliques}"
    for stored in bound:
        record = record_of(stored)
        assert record["group"] == f"{NS}/jobset/train/workers"
        assert record["domain"] == f"{CLIQUE}={next(iter(cliques))}"
        assert _node_allowed(core, stored)


@pytest.fixture(scope="module")
def agent_api(admin: client.ApiClient, core: client.CoreV1Api) -> client.CustomObjectsApi:
    """The agent's ServiceAccount, with a token bound to an agent pod on gb-0 (as the kubelet mounts it)."""
    agent = f"{RELEASE}-agent"
    body = pod(
        "agent-gb-0",
        [{"name": "agent", "image": "gpu-admission:test"}],
        serviceAccountName=agent,
        nodeName="gb-0",
    )
    created = core.create_namespaced_pod(NAMESPACE, body)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=3600,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=created.metadata.name, uid=created.metadata.uid
            ),
        )
    )
    token = core.create_namespaced_service_account_token(agent, NAMESPACE, request).status.token
    configuration = client.Configuration()
    configuration.host = admin.configuration.host
    configuration.ssl_ca_cert = admin.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.CustomObjectsApi(client.ApiClient(configuration))


def test_the_agent_publishes_its_own_nodes_inventory_and_no_other(
    agent_api: client.CustomObjectsApi, admin: client.ApiClient
) -> None:
    nvml = fake_nvml.dgx_h100()
    nvml.nvmlInit()
    spec = discover(nvml)
    status = inventory_status(spec, "570.86.15")
    assert InventoryPublisher(agent_api, "gb-0").publish(spec, status) == "created"
    stored = client.CustomObjectsApi(admin).get_cluster_custom_object(
        "gpu-admission.io", "v1alpha1", "gpuinventories", "gb-0"
    )
    assert stored["spec"] == spec  # nothing pruned: the CRD's schema holds every field the agent writes

    with pytest.raises(PublishError) as other:
        InventoryPublisher(agent_api, "gb-1").publish(spec, status)
    assert "HTTP 403" in str(other.value) and "gb-1" in str(other.value)

    broken = {**spec, "pcie": [["X", "NVLINK-ISH"]]}
    with pytest.raises(PublishError) as invalid:
        InventoryPublisher(agent_api, "gb-0").publish(broken, status)
    assert "HTTP 422" in str(invalid.value)

    with pytest.raises(ApiException) as forbidden:  # the agent's RBAC: GPUInventory objects only
        client.CoreV1Api(agent_api.api_client).list_namespaced_pod(NAMESPACE)
    assert forbidden.value.status == 403
