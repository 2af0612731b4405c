"""admit.mutate() and admit.validate(): exact patches, exact messages, the mutate-then-validate chain."""

from __future__ import annotations

import dataclasses
import json

import jsonpatch
import pytest
from builders import A100, H100, L4, node, pod, snapshot

from webhook.core.admission import admit
from webhook.core.domain.model import QuotaLimits, TopologyClass, Usage
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import NamespaceRule, Policy, parse_policy

CLUSTER = snapshot(node("h1", H100, 8), node("a1", A100, 8, "paired"), node("l1", L4, 2, "none"))
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


DEFAULT = Policy()


def chain(p: dict, snap=CLUSTER, policy=DEFAULT):
    """What the API server does: mutate, apply the patch, validate the result."""
    m = admit.mutate(p, snap, policy)
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    return m, patched, admit.validate(patched, snap, policy)


def test_shared_slice_gets_hami_limits_and_moves_memory_and_cores_to_the_annotation() -> None:
    m, patched, v = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}))
    container = patched["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert container["env"] == [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "3000m"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"},
    ]
    assert patched["spec"]["tolerations"] == [TOLERATION]
    assert patched["metadata"]["labels"] == {"gpu-admission.io/managed": "true"}
    record = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    assert len(record.pop("seal")) == 32  # the HMAC that makes the record the webhook's word (test_record_trust)
    assert record.pop("required") == {"key": "metadata.name", "operator": "In", "values": ["a1", "h1", "l1"]}
    assert record == {
        "version": 1,
        "node": "a1",
        "gpus": [0],
        "uuids": ["GPU-a1-0"],
        "gpuCount": 1,
        "memoryMiB": 3000,
        "cores": 30,
        "vendor": "nvidia",
        "model": "NVIDIA-A100-SXM4-40GB",
        "topology": "single",
        "loss": 0.0,
        "policy": "binpack",
    }
    assert v.allowed and v.patch == () and v.allocation == m.allocation


def test_required_affinity_lists_eligible_nodes_and_preferred_ranks_the_best() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 8}))
    node_affinity = patched["spec"]["affinity"]["nodeAffinity"]
    required = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert required == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a1", "h1"]}]}]
    preferred = node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [p["preference"]["matchFields"][0]["values"][0] for p in preferred][0] == "h1"
    assert [p["weight"] for p in preferred] == [100, 90]


def _required_terms(snap, request: dict) -> list:
    _, patched, _ = chain(pod(request), snap)
    return patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]


def test_required_affinity_names_the_gpu_models_when_eligible_nodes_are_all_nodes_of_those_models() -> None:
    snap = snapshot(node("h1", H100, 8), node("h2", H100, 8), node("h3", H100, 8), node("a1", A100, 8, "paired"))
    by_model = {"key": "nvidia.com/gpu.product", "operator": "In", "values": [A100[0], H100[0]]}
    assert _required_terms(snap, {"nvidia.com/gpu": 1}) == [{"matchExpressions": [by_model]}]


def test_required_affinity_names_nodes_when_some_node_of_the_model_is_not_eligible() -> None:
    small = node("h4", H100, 2)  # an H100 node too small for an 8-GPU pod
    snap = snapshot(node("h1", H100, 8), node("h2", H100, 8), node("h3", H100, 8), small)
    names = {"key": "metadata.name", "operator": "In", "values": ["h1", "h2", "h3"]}
    assert _required_terms(snap, {"nvidia.com/gpu": 8}) == [{"matchFields": [names]}]
    # The same cluster for a 1-GPU pod: every H100 node is eligible, so the model says it in one word.
    by_model = {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100[0]]}
    assert _required_terms(snap, {"nvidia.com/gpu": 1}) == [{"matchExpressions": [by_model]}]


def test_required_affinity_names_nodes_that_carry_no_model_label() -> None:
    unlabelled = [dataclasses.replace(node(n, H100, 8), labels={}) for n in ("h1", "h2", "h3")]
    names = {"key": "metadata.name", "operator": "In", "values": ["h1", "h2", "h3"]}
    assert _required_terms(snapshot(*unlabelled), {"nvidia.com/gpu": 1}) == [{"matchFields": [names]}]


def test_existing_node_affinity_terms_are_anded_with_ours() -> None:
    user = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]},
                ]
            }
        }
    }
    zoned = snapshot(*(dataclasses.replace(n, labels={**n.labels, "zone": z}) for n, z in
                       zip(CLUSTER.nodes.values(), ("z1", "z2", "z3"), strict=True)))  # the user's zones exist
    _, patched, _ = chain(pod({"nvidia.com/gpu": 8}, affinity=user), zoned)
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    ours = [{"key": "metadata.name", "operator": "In", "values": ["a1", "h1"]}]
    assert terms == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}], "matchFields": ours},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}], "matchFields": ours},
    ]


def test_multi_gpu_prefers_an_nvlink_set() -> None:
    m, _, _ = chain(pod({"nvidia.com/gpu": 4}))
    assert m.allocation is not None
    assert m.allocation.topology is TopologyClass.NVLINK and m.allocation.node == "h1"


def test_second_mutation_of_a_mutated_pod_yields_no_operations() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 50}))
    again = admit.mutate(patched, CLUSTER, Policy())
    assert again.allowed and again.patch == ()


def test_only_cores_given_takes_the_whole_memory_of_the_card() -> None:
    # As HAMi: gpumem-percentage defaults to 100 when only gpucores is given.
    m, patched, _ = chain(pod({"nvidia.com/gpucores": 25}))
    assert m.allocation is not None and m.allocation.cores == 25
    card = {"a1": A100[1], "h1": H100[1], "l1": L4[1]}[m.allocation.node or ""]
    assert m.allocation.memory_mib == card
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_mps_backend_writes_mps_variables() -> None:
    policy = parse_policy({"defaults": {"backend": "mps"}})
    _, patched, v = chain(
        pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 40}), policy=policy
    )
    assert patched["spec"]["containers"][0]["env"] == [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "40"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=4000M,1=4000M"},
    ]
    assert v.allowed


def test_quota_denial_names_quota_used_asked_and_limit() -> None:
    snap = snapshot(
        node("h1", H100, 8), quotas={"team-a": (QuotaLimits("gpu-quota", gpus=4),)}, used={"team-a": Usage(3, 0, 300)}
    )
    d = admit.mutate(pod({"nvidia.com/gpu": 2}), snap, Policy())
    assert not d.allowed and d.code == 403 and d.reason == "quota-exceeded"
    assert d.message == (
        "exceeds ResourceQuota team-a/gpu-quota: requests.nvidia.com/gpu used 3, asked 2, limit 4; ask for at most 1"
    )


def test_memory_quota_counts_memory_times_gpus() -> None:
    snap = snapshot(node("h1", H100, 8), quotas={"team-a": (QuotaLimits("mem", memory_mib=10000),)})
    d = admit.mutate(pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 6000}), snap, Policy())
    assert not d.allowed
    assert "limits.nvidia.com/gpumem used 0 MiB, asked 12000 MiB, limit 10000 MiB" in d.message


def test_near_quota_warns_under_120_characters() -> None:
    snap = snapshot(
        node("h1", H100, 8), quotas={"team-a": (QuotaLimits("gpu-quota", gpus=4),)}, used={"team-a": Usage(2, 0, 0)}
    )
    d = admit.mutate(pod({"nvidia.com/gpu": 2}), snap, Policy())
    assert d.allowed
    assert d.warnings == ("gpu-quota: requests.nvidia.com/gpu at 100% of quota after this pod",)
    assert all(len(w) < 120 for w in d.warnings)


@pytest.mark.parametrize(
    ("limits", "annotations", "reason", "fragment"),
    [
        ({"nvidia.com/gpu": 16}, None, "too-many-gpus", "asks for 16 GPUs in one pod; the largest eligible node has 8"),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 90000},
            None,
            "memory-too-large",
            "the largest eligible card has 81559 MiB",
        ),
        ({"nvidia.com/gpu": 1}, {"nvidia.com/use-gputype": "V100"}, "no-such-model", "asks for GPU model V100"),
        (
            {"nvidia.com/gpu": 4},
            {"gpu-admission.io/topology": "required", "nvidia.com/use-gputype": "L4"},
            "too-many-gpus",
            "the largest eligible node has 2",
        ),
    ],
)
def test_unsatisfiable_requests_are_422_with_the_figures(limits, annotations, reason, fragment) -> None:
    d = admit.mutate(pod(limits, annotations=annotations), CLUSTER, Policy())
    assert (d.allowed, d.code, d.reason) == (False, 422, reason)
    assert fragment in d.message


def test_required_topology_without_an_nvlink_set_big_enough() -> None:
    snap = snapshot(node("a1", A100, 8, "paired"))
    d = admit.mutate(pod({"nvidia.com/gpu": 4}, annotations={"gpu-admission.io/topology": "required"}), snap, Policy())
    assert (d.allowed, d.code, d.reason) == (False, 422, "topology-unsatisfiable")
    assert "the largest NVLink-connected set on any eligible node has 2 GPUs" in d.message


def test_policy_max_gpus_per_pod_is_403() -> None:
    policy = Policy(namespaces={"team-a": NamespaceRule(max_gpus_per_pod=2)})
    d = admit.mutate(pod({"nvidia.com/gpu": 4}), CLUSTER, policy)
    assert (d.allowed, d.code, d.reason) == (False, 403, "max-gpus-per-pod")
    assert "namespace team-a allows at most 2 per pod" in d.message


def test_sharing_forbidden_by_policy() -> None:
    policy = Policy(namespaces={"team-a": NamespaceRule(allow_sharing=False)})
    d = admit.mutate(pod({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 20}), CLUSTER, policy)
    assert (d.allowed, d.reason) == (False, "sharing-not-allowed")


def test_user_set_visibility_variable_is_refused_even_without_a_gpu_request() -> None:
    d = admit.mutate(pod(None, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), CLUSTER, Policy())
    assert not d.allowed and d.code == 403 and "NVIDIA_VISIBLE_DEVICES" in d.message


def test_lifting_a_limit_after_mutation_is_refused_by_validate() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}))
    patched["spec"]["containers"][0]["env"][1]["value"] = "100"
    v = admit.validate(patched, CLUSTER, Policy())
    assert not v.allowed and v.code == 403 and v.reason == "isolation-env"
    assert "CUDA_DEVICE_SM_LIMIT='100'" in v.message


def test_removed_limit_variable_is_refused_by_validate() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}))
    del patched["spec"]["containers"][0]["env"][0]
    v = admit.validate(patched, CLUSTER, Policy())
    assert (v.allowed, v.reason) == (False, "limits-missing")


def test_validate_refuses_a_gpu_pod_the_mutating_webhook_never_saw() -> None:
    v = admit.validate(pod({"nvidia.com/gpu": 1}), CLUSTER, Policy())
    assert (v.allowed, v.code, v.reason) == (False, 403, "not-mutated")


def test_resources_changed_after_mutation_are_refused() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1}))
    patched["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 4
    v = admit.validate(patched, CLUSTER, Policy())
    # The seal binds the record to the pod's GPU count per container: the record is no longer the webhook's.
    assert (v.allowed, v.reason) == (False, "annotation-not-sealed")


def test_node_name_on_a_gpu_pod_is_refused() -> None:
    d = admit.mutate(pod({"nvidia.com/gpu": 1}, nodeName="h1"), CLUSTER, Policy())
    assert (d.allowed, d.reason) == (False, "node-name-set")


def test_unmanaged_namespace_and_non_gpu_pods_are_allowed_unchanged() -> None:
    d = admit.mutate(pod({"nvidia.com/gpu": 1}, namespace="sandbox"), CLUSTER, Policy())
    assert (d.allowed, d.managed, d.patch, d.reason) == (True, False, (), "not-managed")
    d = admit.mutate(pod({"cpu": "1"}), CLUSTER, Policy())
    assert (d.allowed, d.gpu_pod, d.patch) == (True, False, ())


def test_full_cluster_admits_with_required_affinity_and_a_warning() -> None:
    snap = snapshot(node("l1", L4, 2, "none"))
    first, patched, _ = chain(pod({"nvidia.com/gpu": 2}), snap)
    from webhook.core.placement.state import with_allocation

    assert first.allocation is not None
    full = with_allocation(snap, "team-a", first.allocation)
    d = admit.mutate(pod({"nvidia.com/gpu": 1}, name="q"), full, Policy())
    assert d.allowed and d.allocation is not None and d.allocation.node is None
    assert d.warnings == ("no GPU free now; pod waits for one of 1 eligible node(s)",)
    denied = admit.mutate(pod({"nvidia.com/gpu": 1}, name="q"), full, Policy(when_full="deny"))
    assert (denied.allowed, denied.reason) == (False, "cluster-full")


def test_foreign_scheduler_gets_no_node_affinity_but_keeps_limits() -> None:
    _, patched, v = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}, schedulerName="volcano"))
    assert "affinity" not in patched["spec"]
    assert patched["spec"]["containers"][0]["env"][0] == {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "2000m"}
    assert v.allowed


def test_zero_gpus_is_allowed_unchanged_but_still_held_to_isolation() -> None:
    d = admit.mutate(pod({"nvidia.com/gpu": 0}), CLUSTER, Policy())
    assert (d.allowed, d.patch, d.reason) == (True, (), "no-gpu-requested")
    bypass = pod({"nvidia.com/gpu": 0}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    assert admit.mutate(bypass, CLUSTER, Policy()).allowed is False


def test_the_patch_leaves_the_pod_as_it_was_and_keeps_what_the_pod_had() -> None:
    """Operations may share the members they keep with the pod, so neither mutate nor applying the
    patch may change the pod itself; and every existing toleration, variable and affinity term stays."""
    p = pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}, env=[{"name": "A", "value": "1"}])
    p["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 7, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}
            ],
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    before = json.loads(json.dumps(p))
    n1 = dataclasses.replace(node("n1", A100, 8), labels={"zone": "a"})  # in the pod's required zone
    decision = admit.mutate(p, snapshot(n1), Policy())
    assert decision.allowed and decision.patch
    assert p == before
    patched = jsonpatch.apply_patch(p, [dict(op) for op in decision.patch])
    assert p == before
    spec = patched["spec"]
    assert spec["tolerations"][0] == before["spec"]["tolerations"][0]
    assert {"name": "A", "value": "1"} in spec["containers"][0]["env"]
    assert "nvidia.com/gpumem" not in spec["containers"][0]["resources"]["limits"]
    node_affinity = spec["affinity"]["nodeAffinity"]
    (term,) = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0] == {"key": "zone", "operator": "In", "values": ["a"]}
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 7
    assert spec["affinity"]["podAntiAffinity"] == before["spec"]["affinity"]["podAntiAffinity"]
