"""Node pools the cluster states, read as pools that scale from zero: Karpenter NodePools and the Cluster
API node groups cluster-autoscaler scales (`webhook/cluster/nodepools.py`), kept by the watch cache as
`build_snapshot` reads them, an absent or unreadable API listing none."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest
import yaml
from builders import H100, node, pod
from fake_custom_objects import refusing_lister
from pool_support import TOLERATE_GPU, fixture, h100_nodepool, training_pod, with_pools

from webhook.cluster import kube
from webhook.cluster.cache import ClusterCache
from webhook.cluster.files import load_cluster
from webhook.cluster.nodepools import read_pool
from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.domain.model import Taint
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import Policy

README = "autoscaler-clusterapi-readme-scale-from-zero.yaml"
NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "team-a", "labels": {"gpu-admission.io/enabled": "true"}}}


def raw_node(name: str, nodepool: str, gpus: int = 8) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": nodepool,
                                                  "nvidia.com/gpu.product": H100[0], "nvidia.com/gpu.count": str(gpus),
                                                  "nvidia.com/gpu.memory": str(H100[1])}},
            "spec": {"unschedulable": True},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "192", "memory": "2000Gi"}}}


def test_the_autoscaler_readme_machinedeployment_is_a_pool_of_two_gpu_nodes() -> None:
    gpu, labelled = fixture(README)
    pool = read_pool(gpu)
    assert not isinstance(pool, str)
    assert (pool.ref, pool.gpu_count, pool.vendor, pool.cpu_milli, pool.host_memory_mib, pool.full) == (
        "MachineDeployment/capi-workload/gpu-workers", 2, "nvidia", 16000, 122071, "")
    assert read_pool(labelled) == ("states no GPUs: capacity.cluster-autoscaler.kubernetes.io/gpu-count and "
                                   "capacity.cluster-autoscaler.kubernetes.io/gpu-type are needed")
    # the README's labels and taints, on a group that also states GPUs
    annotations = {**labelled["metadata"]["annotations"], **{k: v for k, v in gpu["metadata"]["annotations"].items()
                                                              if "gpu" in k}}
    both = read_pool({**labelled, "metadata": {**labelled["metadata"], "annotations": annotations}})
    assert not isinstance(both, str)
    assert dict(both.labels) == {"key1": "value1", "key2": "value2"}
    assert both.taints == (Taint("key1", "value1", "NoSchedule"), Taint("key2", "value2", "NoExecute"))


def test_a_pod_waits_for_the_machinedeployment_until_it_is_at_its_max_size() -> None:
    (gpu, _) = fixture(README)
    p = pod({"nvidia.com/gpu": 2}, tolerations=list(TOLERATE_GPU))
    d = admit.mutate(p, with_pools([gpu]), Policy())
    assert (d.allowed, d.reason) == (True, "awaiting-capacity"), d.message
    assert any("waits for capacity from MachineDeployment capi-workload/gpu-workers" in w for w in d.warnings)
    record = json.loads(jsonpatch.apply_patch(p, list(d.patch))["metadata"]["annotations"][ANNOTATION])
    assert record["awaitingPool"] == "MachineDeployment/capi-workload/gpu-workers"
    full = {**gpu, "spec": {"replicas": 5}}
    r = admit.mutate(p, with_pools([full]), Policy())
    assert (r.allowed, r.code) == (False, 422)
    assert "MachineDeployment/capi-workload/gpu-workers: at its max size (5 of 5 nodes)" in r.message
    bigger = admit.mutate(pod({"nvidia.com/gpu": 4}), with_pools([gpu]), Policy())
    assert not bigger.allowed and "gpu-workers: 2 GPUs per node" in bigger.message
    hungry = pod({"nvidia.com/gpu": 1, "cpu": "32"})
    assert "gpu-workers: nodes of 16 CPUs" in admit.mutate(hungry, with_pools([gpu]), Policy()).message


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"metadata": {"annotations": {}}}, "not autoscaled"),
        ({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}}, "paused"),
        ({"metadata": {"annotations": {"capacity.cluster-autoscaler.kubernetes.io/gpu-type": ""}}}, "states no GPUs"),
        ({"metadata": {"annotations": {"capacity.cluster-autoscaler.kubernetes.io/gpu-type": "example.com/fpga"}}},
         "is not a GPU resource this webhook knows"),
    ],
)
def test_a_node_group_that_states_no_gpu_node_is_no_pool(change: dict[str, Any], why: str) -> None:
    (gpu, _) = fixture(README)
    annotations = dict(gpu["metadata"]["annotations"])
    if change["metadata"]["annotations"]:
        annotations.update(change["metadata"]["annotations"])
    else:
        annotations = {k: v for k, v in annotations.items() if "node-group" not in k}
    found = read_pool({**gpu, "metadata": {**gpu["metadata"], "annotations": annotations}})
    assert isinstance(found, str) and why in found


def test_a_nodepool_reads_its_labels_requirements_taints_and_limits_not_its_startup_taints() -> None:
    pool = read_pool(h100_nodepool())
    assert not isinstance(pool, str)
    assert (pool.kind, pool.ref, pool.limits) == ("NodePool", "NodePool/h100", {"nvidia.com/gpu": 16, "cpu": 2_000_000})
    assert pool.labels["karpenter.sh/nodepool"] == "h100" and pool.labels["team"] == "research"
    assert pool.labels["karpenter.k8s.aws/instance-gpu-name"] == "h100"  # a single-valued In requirement
    assert "karpenter.sh/capacity-type" not in pool.labels  # two values: a requirement, not a label
    assert pool.taints == (Taint("nvidia.com/gpu", "", "NoSchedule"),)
    not_ready = {**h100_nodepool(), "status": {"conditions": [{"type": "Ready", "status": "False",
                                                                "reason": "NodeClassNotReady"}]}}
    unready = read_pool(not_ready)
    assert not isinstance(unready, str) and unready.full == "the NodePool is not Ready (NodeClassNotReady)"


def test_the_cache_keeps_the_pools_as_build_snapshot_reads_them_and_counts_the_nodepools_nodes() -> None:
    (md, _) = fixture(README)
    cache = ClusterCache()
    for kind in kube.KINDS:
        if kind not in ("nodepools", "machinedeployments", "nodes"):
            cache.replace(kind, [])
    cache.replace("nodes", [raw_node("h100-0", "h100")])
    general = fixture("karpenter-provider-aws-examples-v1-general-purpose.yaml")  # a NodePool, an EC2NodeClass
    cache.replace("nodepools", [h100_nodepool(), general[0]])
    cache.replace("machinedeployments", [md])
    objects = [raw_node("h100-0", "h100"), h100_nodepool(), md, *general]
    pools = cache.snapshot().scale_pools
    assert pools == build_snapshot(objects).scale_pools
    assert [p.ref for p in pools] == ["NodePool/general-purpose", "NodePool/h100",
                                      "MachineDeployment/capi-workload/gpu-workers"]
    assert pools[1].used == {"nvidia.com/gpu": 8, "cpu": 192_000}
    # a second node of the NodePool: its pool counts it; a status change of the NodePool publishes nothing new
    cache.apply("nodes", "ADDED", raw_node("h100-1", "h100"))
    assert cache.snapshot().scale_pools[1].used["nvidia.com/gpu"] == 16
    before = cache.snapshot()
    cache.apply("nodepools", "MODIFIED", {**h100_nodepool(), "status": {"resources": {"nodes": "2"}}})
    assert cache.snapshot().scale_pools == before.scale_pools
    cache.apply("nodepools", "DELETED", h100_nodepool())
    cache.replace("machinedeployments", [])
    assert [p.ref for p in cache.snapshot().scale_pools] == ["NodePool/general-purpose"]


def test_absent_or_unreadable_pool_apis_list_empty() -> None:
    for status in (404, 403):
        lister: Any = refusing_lister(status)
        for kind in ("nodepools", "machinedeployments", "machinesets", "machinepools", "xgboostjobs", "paddlejobs",
                     "jaxjobs"):
            assert [page["items"] for page in lister.list_pages(kind)] == [[]]
    assert kube.KINDS["nodepools"] == ("karpenter.sh/v1", "NodePool")
    assert kube.KINDS["machinedeployments"] == ("cluster.x-k8s.io/v1beta1", "MachineDeployment")
    assert kube.KINDS["jaxjobs"] == ("kubeflow.org/v1", "JAXJob")


def test_a_cluster_file_states_its_pools_and_an_8_gpu_pod_waits_for_a_new_h100_node(tmp_path: Any) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([NAMESPACE, raw_node("h100-0", "h100"), raw_node("h100-1", "h100"),
                                        h100_nodepool(gpu_limit=24)]))
    snapshot = build_snapshot(load_cluster([str(path)]))
    assert [p.ref for p in snapshot.scale_pools] == ["NodePool/h100"]
    d = admit.mutate(training_pod(8), snapshot, Policy())  # both nodes cordoned: only a new node can host it
    assert (d.allowed, d.reason) == (True, "awaiting-capacity"), d.message
    assert d.allocation is not None and d.allocation.awaiting_pool == "NodePool/h100"
    # a third node uses the limit up
    path.write_text(yaml.safe_dump_all([NAMESPACE, *(raw_node(f"h100-{i}", "h100") for i in range(3)),
                                        h100_nodepool(gpu_limit=24)]))
    r = admit.mutate(training_pod(8), build_snapshot(load_cluster([str(path)])), Policy())
    assert (r.allowed, r.code) == (False, 422) and "is used up by its nodes (24)" in r.message


def test_a_waiting_pod_on_a_known_node_set_keeps_the_cluster_answer() -> None:
    free = with_pools([h100_nodepool()], node("h1", H100, 8))
    d = admit.mutate(training_pod(8, {}), free, Policy())
    assert d.allowed and d.allocation is not None and d.allocation.node == "h1"  # an existing node first
    assert (d.reason, d.allocation.awaiting_pool) != ("awaiting-capacity", "NodePool/h100")
