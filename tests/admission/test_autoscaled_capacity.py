"""Autoscaled capacity: a pod that no existing node can host, but a node pool scaling from zero (policy
`capacity.scaleFromZero`) could, or that consumes a ProvisioningRequest, is admitted to wait for its node
instead of refused (a refused pod is never made, so the autoscaler never makes its node)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from builders import H100, L4, node, pod, snapshot

from webhook.core.admission import admit
from webhook.core.domain.model import Gpu, Node, QuotaLimits, Taint
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import NamespaceRule, Policy, PolicyError, parse_policy

FIXTURES = Path(__file__).parent.parent / "fixtures" / "capacity"
A100_40 = ("NVIDIA-A100-SXM4-40GB", 40960)

POLICY = parse_policy(yaml.safe_load("""
capacity:
  scaleFromZero:
    - name: a100-spot
      labels: {cloud.google.com/gke-accelerator: nvidia-tesla-a100, cloud.google.com/gke-gpu-driver-version: latest,
               node.kubernetes.io/instance-type: a2-highgpu-8g}
      taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
      gpu: {model: NVIDIA-A100-SXM4-40GB, count: 8, memoryMiB: 40960}
    - name: gpu
      labels: {karpenter.sh/nodepool: gpu, intent: gpu, karpenter.k8s.aws/instance-gpu-name: t4}
      taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
      gpu: {model: Tesla-T4, count: 1, memoryMiB: 15360}
"""))


def template_pod(name: str, namespace: str = "team-a") -> dict[str, Any]:
    """The pod a workload manifest's first pod template makes (or the manifest itself when it is a Pod)."""
    doc = next(d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d and d["kind"] != "Service")
    if doc["kind"] == "Pod":
        return {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    template = doc["spec"]["template"]
    metadata = {**template.get("metadata", {}), "name": doc["metadata"].get("name", "job-0"), "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def env_of(p: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in p["spec"]["containers"][0].get("env", [])}


def pool_made_node(name: str, labels: dict[str, str], model: tuple[str, int], count: int,
                   taints: tuple[Taint, ...]) -> Node:
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", model[0], model[1]) for i in range(count))
    return Node(name, gpus, labels={**labels, "nvidia.com/gpu.product": model[0]}, taints=taints,
                cpu_milli=96_000, memory_mib=1_000_000, inventory_source="labels")


def test_the_gke_a100_deployment_waits_for_the_a100_pool_and_validates_once_its_node_exists() -> None:
    p = template_pod("gke-llm-serving-gemma-vllm-3-27b-it-a100-40gb.yaml")
    cluster = snapshot(node("h1", H100, 8), node("l1", L4, 4))
    before = admit.mutate(p, cluster, Policy())
    assert (before.allowed, before.code, before.reason) == (False, 422, "no-matching-node")

    d = admit.mutate(p, cluster, POLICY)
    assert (d.allowed, d.reason) == (True, "awaiting-capacity")
    assert any("waits for capacity from pool a100-spot" in w for w in d.warnings)
    assert "pool a100-spot" in d.message
    assert d.allocation is not None and d.allocation.node is None
    assert (d.allocation.model, d.allocation.memory_mib, d.allocation.gpu_count) == (A100_40[0], 40960, 2)
    mutated = jsonpatch.apply_patch(p, list(d.patch))
    assert env_of(mutated)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40960m"
    assert env_of(mutated)["CUDA_DEVICE_MEMORY_LIMIT_1"] == "40960m"
    # placement is the scheduler's and the autoscaler's: no node affinity naming existing nodes
    assert "affinity" not in mutated["spec"]
    assert json.loads(mutated["metadata"]["annotations"][ANNOTATION])["node"] is None

    # the node appears: the pod, as mutated, passes validation and keeps its limits
    made = pool_made_node("gke-a100-0", dict(POLICY.scale_from_zero[0].labels), A100_40, 8,
                          POLICY.scale_from_zero[0].taints)
    grown = snapshot(node("h1", H100, 8), node("l1", L4, 4), made)
    v = admit.validate(mutated, grown, POLICY)
    assert v.allowed, v.message
    assert admit.mutate(mutated, grown, POLICY).patch == ()  # idempotent: nothing more to write
    assert admit.validate(mutated, cluster, POLICY).allowed  # and before the node exists too


def test_the_karpenter_blueprint_pod_waits_for_the_gpu_nodepool_on_a_cluster_without_gpu_nodes() -> None:
    p = template_pod("karpenter-blueprints-nvidia-gpu-workload.yaml")
    empty = snapshot()
    assert admit.mutate(p, empty, Policy()).allowed is False
    d = admit.mutate(p, empty, POLICY)
    assert (d.allowed, d.reason) == (True, "awaiting-capacity")
    assert any("pool gpu" in w for w in d.warnings)
    assert d.allocation is not None and (d.allocation.model, d.allocation.memory_mib) == ("Tesla-T4", 15360)
    assert env_of(jsonpatch.apply_patch(p, list(d.patch)))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "15360m"


def test_a_karpenter_nodepool_selector_reaches_the_declared_pool_only() -> None:
    tolerate = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    cluster = snapshot(node("h1", H100, 8))
    p = pod({"nvidia.com/gpu": 1}, nodeSelector={"karpenter.sh/nodepool": "gpu"}, tolerations=tolerate)
    before = admit.mutate(p, cluster, Policy())
    assert (before.allowed, before.reason) == (False, "no-matching-node")
    d = admit.mutate(p, cluster, POLICY)
    assert (d.allowed, d.reason) == (True, "awaiting-capacity")
    # another pool name: neither nodes nor pools, refused naming the pools considered
    other = pod({"nvidia.com/gpu": 1}, nodeSelector={"karpenter.sh/nodepool": "inference"}, tolerations=tolerate)
    r = admit.mutate(other, cluster, POLICY)
    assert (r.allowed, r.code, r.reason) == (False, 422, "no-matching-node")
    assert "no scale-from-zero pool fits either" in r.message
    assert "a100-spot: its nodes fail the pod's nodeSelector karpenter.sh/nodepool=inference" in r.message
    assert "gpu: its nodes fail the pod's nodeSelector" in r.message


@pytest.mark.parametrize(
    ("limits", "policy", "why"),
    [
        ({"nvidia.com/gpu": 2}, POLICY, "gpu: 1 GPUs per node"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}, POLICY, "gpu: cards of 15360 MiB"),
        ({"nvidia.com/gpu": 1}, dataclasses.replace(POLICY, namespaces={"team-a": NamespaceRule(
            allowed_models=("H100",))}), "gpu: model Tesla-T4 is not among allowedModels H100"),
    ],
)
def test_a_pool_whose_gpus_do_not_fit_is_no_way_out(limits, policy, why) -> None:
    p = pod(limits, nodeSelector={"karpenter.sh/nodepool": "gpu"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    d = admit.mutate(p, snapshot(node("h1", H100, 8)), policy)
    assert (d.allowed, d.code) == (False, 422)
    assert why in d.message


def test_the_kueue_provisioning_sample_waits_for_the_first_declared_pool_its_tolerations_allow() -> None:
    p = template_pod("kueue-provisioning-sample-job.yaml")
    before = admit.mutate(p, snapshot(), Policy())
    assert (before.allowed, before.code, before.reason) == (False, 422, "no-such-gpu")
    d = admit.mutate(p, snapshot(), POLICY)
    assert (d.allowed, d.reason) == (True, "awaiting-capacity")
    assert any("pool a100-spot" in w for w in d.warnings)


@pytest.mark.parametrize("key", ["autoscaling.x-k8s.io/consume-provisioning-request",
                                 "cluster-autoscaler.kubernetes.io/consume-provisioning-request"])
def test_a_pod_consuming_a_provisioning_request_is_admitted_without_any_policy(key) -> None:
    p = template_pod("kueue-provisioning-sample-job.yaml")
    without = admit.mutate(p, snapshot(), Policy())
    assert (without.allowed, without.code) == (False, 422)
    p["metadata"]["annotations"] = {key: "sample-job-prov-1"}
    d = admit.mutate(p, snapshot(), Policy())
    assert (d.allowed, d.reason) == (True, "awaiting-capacity")
    assert any("the autoscaler (ProvisioningRequest sample-job-prov-1)" in w for w in d.warnings)
    assert d.allocation is not None and d.allocation.node is None and d.allocation.gpu_count == 1
    mutated = jsonpatch.apply_patch(p, list(d.patch))
    assert admit.validate(mutated, snapshot(), Policy()).allowed


def test_a_waiting_pod_still_counts_against_its_quota() -> None:
    p = pod({"nvidia.com/gpu": 2}, nodeSelector={"cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
                                                  "cloud.google.com/gke-gpu-driver-version": "latest"})
    full = snapshot(quotas={"team-a": (QuotaLimits("gpu-quota", gpus=1),)})
    d = admit.mutate(p, full, POLICY)
    assert (d.allowed, d.code) == (False, 403) and "gpu-quota" in d.message


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"scaleFromZero": [{"name": "x", "gpus": {}}]}, "capacity.scaleFromZero[0].gpus"),
        ({"scaleFromZero": [{"name": "x", "gpu": {"count": 0}}]}, "capacity.scaleFromZero[0].gpu.count"),
        ({"scaleFromZero": [{"name": "x", "gpu": {"memoryMiB": "40Gi"}}]},
         "capacity.scaleFromZero[0].gpu.memoryMiB"),
        ({"scaleFromZero": [{"gpu": {}}]}, "capacity.scaleFromZero[0].name"),
        ({"scaleFromZero": [{"name": "x", "taints": [{"key": "k", "effect": "Never"}]}]},
         "capacity.scaleFromZero[0].taints[0].effect"),
        ({"scaleFromZero": [{"name": "x", "labels": {"a": 1}}]}, "capacity.scaleFromZero[0].labels.a"),
        ({"scaleFromZero": [{"name": "x"}, {"name": "x"}]}, "capacity.scaleFromZero[1].name"),
        ({"scaleFromZero": {"name": "x"}}, "capacity.scaleFromZero"),
        ({"pools": []}, "capacity.pools"),
    ],
)
def test_policy_errors_in_the_capacity_section_name_the_field(section, field) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy({"capacity": section})
    assert err.value.field == field
