"""Karpenter NodePools read from the cluster as pools that scale from zero: a pod no existing node can
host waits for the node a NodePool can make, matched as Karpenter matches a pod to a NodePool (its labels
and requirements, its taints, its limits), and is refused, naming the NodePool and why, when none can."""

from __future__ import annotations

import dataclasses
import json

import jsonpatch
import pytest
import yaml
from builders import H100, L4, node
from pool_support import AWS, fixture, h100_nodepool, training_pod, with_pools

from webhook.core.admission import admit
from webhook.core.placement.capacity import Allowed, incompatible
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import Policy, parse_policy


def env_of(p: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in p["spec"]["containers"][0].get("env", [])}


def test_an_8_gpu_h100_pod_waits_for_the_nodepool_that_can_make_its_node() -> None:
    cluster = with_pools([h100_nodepool()], node("l1", L4, 4))  # no H100 node yet
    p = training_pod(8)
    assert admit.mutate(p, with_pools([], node("l1", L4, 4)), Policy()).allowed is False
    d = admit.mutate(p, cluster, Policy())
    assert (d.allowed, d.reason) == (True, "awaiting-capacity"), d.message
    assert "NodePool h100" in d.message
    assert any("waits for capacity from NodePool h100" in w for w in d.warnings)
    assert d.allocation is not None
    assert (d.allocation.node, d.allocation.gpu_count, d.allocation.model, d.allocation.memory_mib) == (
        None, 8, "h100", 81920)
    mutated = jsonpatch.apply_patch(p, list(d.patch))
    assert env_of(mutated)["CUDA_DEVICE_MEMORY_LIMIT_7"] == "81920m"
    assert "affinity" not in mutated["spec"]
    record = json.loads(mutated["metadata"]["annotations"][ANNOTATION])
    assert (record["node"], record["awaitingPool"]) == (None, "NodePool/h100")
    assert admit.validate(mutated, cluster, Policy()).allowed


def test_a_nodepool_whose_gpu_limit_its_nodes_use_up_makes_no_node() -> None:
    # Two cordoned 8-GPU nodes of the NodePool (being drained) still count against its 16-GPU limit.
    made = [dataclasses.replace(n, labels={**n.labels, "karpenter.sh/nodepool": "h100"}, unschedulable=True,
                                gpu_units=8) for n in (node(f"h100-{i}", H100, 8) for i in range(2))]
    d = admit.mutate(training_pod(8), with_pools([h100_nodepool(gpu_limit=16)], *made), Policy())
    assert (d.allowed, d.code) == (False, 422)
    assert "no scale-from-zero pool fits either" in d.message
    assert "NodePool/h100: its limit nvidia.com/gpu: 16 is used up by its nodes (16), leaving 0" in d.message
    # one node gone: the limit leaves room for one more 8-GPU node
    assert admit.mutate(training_pod(8), with_pools([h100_nodepool(gpu_limit=16)], made[0]), Policy()).allowed


def test_the_blueprint_nodepool_limit_of_five_gpus_refuses_an_8_gpu_pod() -> None:
    (nodepool,) = fixture("karpenter-blueprints-nvidia-gpu-nodepool.yaml")
    p = training_pod(8, {"intent": "gpu", AWS + "instance-gpu-name": "t4"})
    d = admit.mutate(p, with_pools([nodepool]), Policy())
    assert (d.allowed, d.code) == (False, 422)
    assert "NodePool/gpu: its limit nvidia.com/gpu: 5 is used up by its nodes (0), leaving 5" in d.message


def test_a_nodepool_taint_the_pod_does_not_tolerate_is_no_way_out() -> None:
    tainted = h100_nodepool(taints=[{"key": "dedicated", "value": "training", "effect": "NoSchedule"}])
    d = admit.mutate(training_pod(8), with_pools([tainted]), Policy())
    assert (d.allowed, d.code) == (False, 422)
    assert "NodePool/h100: its nodes' taint dedicated=training:NoSchedule is not tolerated" in d.message
    tolerant = training_pod(8)
    tolerant["spec"]["tolerations"].append({"key": "dedicated", "operator": "Equal", "value": "training"})
    assert admit.mutate(tolerant, with_pools([tainted]), Policy()).allowed
    # a startup taint is Karpenter's to remove: no pod tolerates it, and none needs to
    assert admit.mutate(training_pod(8), with_pools([h100_nodepool()]), Policy()).allowed


@pytest.mark.parametrize(
    ("selector", "why"),
    [
        ({AWS + "instance-gpu-name": "a100"},
         f"the pod requires {AWS}instance-gpu-name In [a100], the NodePool In [h100]"),
        ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
         "the pod requires cloud.google.com/gke-accelerator In [nvidia-h100-80gb], a label the NodePool does "
         "not define"),
        ({"team": "inference"}, "the pod requires team In [inference], the NodePool In [research]"),
        ({"karpenter.sh/nodepool": "other"}, "the pod requires karpenter.sh/nodepool In [other]"),
        ({"karpenter.sh/capacity-type": "reserved"}, "the pod requires karpenter.sh/capacity-type In [reserved]"),
    ],
)
def test_requirements_that_exclude_the_pods_node_selector_refuse_it(selector, why) -> None:
    d = admit.mutate(training_pod(8, selector), with_pools([h100_nodepool()]), Policy())
    assert (d.allowed, d.code) == (False, 422)
    assert f"NodePool/h100: {why}" in d.message


@pytest.mark.parametrize(
    "selector",
    [
        {},  # nothing asked: the NodePool decides
        {"team": "research", "karpenter.sh/nodepool": "h100", "karpenter.sh/capacity-type": "spot"},
        {"topology.kubernetes.io/zone": "us-east-1a"},  # well known, left open by the NodePool
        {"failure-domain.beta.kubernetes.io/zone": "us-east-1a"},  # Karpenter reads it as the zone
    ],
)
def test_selectors_the_nodepool_allows_or_leaves_to_the_instance_type_wait_for_it(selector) -> None:
    d = admit.mutate(training_pod(8, selector), with_pools([h100_nodepool()]), Policy())
    assert (d.allowed, d.reason) == (True, "awaiting-capacity"), d.message


def test_required_affinity_is_matched_one_term_at_a_time_and_notin_is_karpenters() -> None:
    def affinity(*terms: list[dict]) -> dict:
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}

    a100 = [{"key": AWS + "instance-gpu-name", "operator": "In", "values": ["a100"]}]
    h100 = [{"key": AWS + "instance-gpu-name", "operator": "In", "values": ["h100", "h200"]}]
    pools = with_pools([h100_nodepool()])
    assert admit.mutate(training_pod(8, {}, affinity=affinity(a100, h100)), pools, Policy()).allowed
    assert not admit.mutate(training_pod(8, {}, affinity=affinity(a100)), pools, Policy()).allowed
    # NotIn a label the NodePool does not define: allowed (Karpenter's Compatible)
    spot_free = [{"key": "example.com/pool", "operator": "NotIn", "values": ["spot"]}]
    assert admit.mutate(training_pod(8, {}, affinity=affinity(spot_free)), pools, Policy()).allowed


def test_gpu_counts_and_memory_bounds_follow_gt_and_lt() -> None:
    def pool(*requirements: dict) -> dict:
        raw = h100_nodepool()
        kept = [r for r in raw["spec"]["template"]["spec"]["requirements"]
                if r["key"] not in (AWS + "instance-gpu-count", AWS + "instance-gpu-memory")]
        raw["spec"]["template"]["spec"]["requirements"] = [*kept, *requirements]
        return raw

    more_than_3 = {"key": AWS + "instance-gpu-count", "operator": "Gt", "values": ["3"]}
    fewer_than_5 = {"key": AWS + "instance-gpu-count", "operator": "Lt", "values": ["5"]}
    assert admit.mutate(training_pod(8), with_pools([pool(more_than_3)]), Policy()).allowed
    d = admit.mutate(training_pod(8), with_pools([pool(fewer_than_5)]), Policy())
    assert not d.allowed and f"{AWS}instance-gpu-count Lt 5 allows no instance with 8 GPUs" in d.message
    # memory only bounded below: a whole card gets no memory limit, a slice within the bound is bounded
    at_least_40g = {"key": AWS + "instance-gpu-memory", "operator": "Gt", "values": ["40000"]}
    whole = admit.mutate(training_pod(1), with_pools([pool(at_least_40g)]), Policy())
    assert whole.allowed and whole.allocation is not None and whole.allocation.memory_mib == 0
    mutated = jsonpatch.apply_patch(training_pod(1), list(whole.patch))
    assert not any(k.startswith("CUDA_DEVICE_MEMORY_LIMIT") for k in env_of(mutated))
    sliced = training_pod(1)
    sliced["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 20000
    d = admit.mutate(sliced, with_pools([pool(at_least_40g)]), Policy())
    assert d.allowed and d.allocation is not None and d.allocation.memory_mib == 20000


def test_the_blueprint_pod_waits_for_the_blueprint_nodepool_with_the_t4_it_selects() -> None:
    (nodepool,) = fixture("karpenter-blueprints-nvidia-gpu-nodepool.yaml")
    (p,) = fixture("karpenter-blueprints-nvidia-gpu-workload.yaml", "capacity")
    p["metadata"]["namespace"] = "team-a"
    d = admit.mutate(p, with_pools([nodepool]), Policy())
    assert (d.allowed, d.reason) == (True, "awaiting-capacity"), d.message
    assert d.allocation is not None and (d.allocation.model, d.allocation.memory_mib) == ("t4", 0)
    mutated = jsonpatch.apply_patch(p, list(d.patch))
    # the NodePool states no GPU memory: the whole card gets no memory variable (unknown card size)
    assert not any(k.startswith("CUDA_DEVICE_MEMORY_LIMIT") for k in env_of(mutated))
    # a slice of a card of unknown memory could not be bounded: refused, naming what is missing
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = 50
    r = admit.mutate(p, with_pools([nodepool]), Policy())
    assert (r.allowed, r.code) == (False, 422)
    missing = f"NodePool/gpu: cards of unknown memory (the NodePool states no single {AWS}instance-gpu-memory)"
    assert missing in r.message


def test_a_general_purpose_nodepool_makes_no_gpu_node() -> None:
    objects = fixture("karpenter-provider-aws-examples-v1-general-purpose.yaml")
    d = admit.mutate(training_pod(1, {}), with_pools(objects), Policy())
    assert (d.allowed, d.code) == (False, 422)
    assert f"NodePool/general-purpose: {AWS}instance-category In [c, m, r] allows no GPU instance" in d.message


def test_several_gpu_names_must_all_be_the_model_the_pod_names() -> None:
    names = {"key": AWS + "instance-gpu-name", "operator": "In", "values": ["a100", "h100"]}
    raw = h100_nodepool()
    raw["spec"]["template"]["spec"]["requirements"][1] = names
    hami = {"nvidia.com/use-gputype": "H100"}
    d = admit.mutate(training_pod(8, {}, annotations=hami), with_pools([raw]), Policy())
    assert not d.allowed and f"{AWS}instance-gpu-name In [a100, h100] allows a100, not H100" in d.message
    # the pod's own selector narrows the names to one: Karpenter launches an H100
    assert admit.mutate(training_pod(8, annotations=hami), with_pools([raw]), Policy()).allowed


def test_the_policys_pool_wins_over_a_nodepool_of_the_same_name() -> None:
    policy = parse_policy(yaml.safe_load("""
capacity:
  scaleFromZero:
    - name: h100
      labels: {karpenter.k8s.aws/instance-gpu-name: h100}
      taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
      gpu: {model: NVIDIA-H100-80GB-HBM3, count: 8, memoryMiB: 81559}
"""))
    d = admit.mutate(training_pod(8), with_pools([h100_nodepool()]), policy)
    assert d.allowed and d.allocation is not None
    assert (d.allocation.awaiting_pool, d.allocation.model) == ("h100", "NVIDIA-H100-80GB-HBM3")


def test_karpenters_requirement_algebra() -> None:
    gt3, lt5 = Allowed.of("Gt", ("3",)), Allowed.of("Lt", ("5",))
    assert (gt3 & lt5).has("4") and not (gt3 & lt5).has("5")
    assert (Allowed.of("Gt", ("5",)) & Allowed.of("Lt", ("5",))).empty
    assert (Allowed.of("In", ("a", "b")) & Allowed.of("NotIn", ("a",))).values == frozenset({"b"})
    assert not incompatible({"k": Allowed.of("NotIn", ("x",))}, {"k": Allowed.of("DoesNotExist", ())})
    assert incompatible({}, {"custom": Allowed.of("Exists", ())})
    assert not incompatible({}, {"kubernetes.io/arch": Allowed.of("In", ("arm64",))})
