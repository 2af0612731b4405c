"""What a pod asks for, case by case, as HAMi reads it (pkg/device/nvidia/device.go: GenerateResourceRequests,
defaultExclusiveCoreIfNeeded, Fit; pkg/scheduler/policy): mutate, apply the patch, validate, as the API
server does, asserting the exact limit variables and the recorded slice."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest
from builders import A100, node, pod, snapshot

from webhook.cluster.podusage import pod_usage_of
from webhook.core.admission import admit
from webhook.core.domain.model import GpuUsage, NodeUsage, QuotaLimits, Usage
from webhook.core.podspec.record import ANNOTATION, allocation_from_json, allocation_to_json
from webhook.core.policy.model import Policy, parse_policy

T4 = ("Tesla-T4", 15360)
A100_ONLY = snapshot(node("a1", A100, 8))
DEFAULT = Policy()


def chain(p: dict[str, Any], snap: Any = A100_ONLY, policy: Policy = DEFAULT) -> tuple[Any, dict[str, Any], Any]:
    m = admit.mutate(p, snap, policy)
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    v = admit.validate(patched, snap, policy)
    assert v.allowed, v.message
    return m, patched, v


def env(patched: dict[str, Any], index: int = 0) -> list[dict[str, str]]:
    return patched["spec"]["containers"][index].get("env", [])


# No compute cap: HAMi's device plugin writes CUDA_DEVICE_SM_LIMIT=0 for such a slice; HAMi-core reads 0
# as no limit, and the cluster accounting reads it as no compute held.
NO_CAP = {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}


def record(patched: dict[str, Any]) -> dict[str, Any]:
    return json.loads(patched["metadata"]["annotations"][ANNOTATION])


# --- memory only: a memory limit, no compute cap ---------------------------------------------------


def test_memory_only_gets_a_memory_limit_and_no_compute_cap() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}))
    assert env(patched) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "20000m"}, NO_CAP]
    assert (record(patched)["memoryMiB"], record(patched)["cores"]) == (20000, 0)
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_a_smaller_card_elsewhere_in_the_cluster_does_not_change_the_slice() -> None:
    # Before, compute was a share of the smallest card anywhere: a T4 turned this 20 GB A100 slice whole.
    p = pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}, annotations={"nvidia.com/use-gputype": "A100"})
    _, alone, _ = chain(p)
    _, mixed, _ = chain(p, snapshot(node("a1", A100, 8), node("t1", T4, 4, "none")))
    assert env(alone) == env(mixed) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "20000m"}, NO_CAP]
    assert record(alone)["cores"] == record(mixed)["cores"] == 0


def test_the_cluster_accounts_a_memory_only_pod_as_holding_no_compute() -> None:
    # The watch cache reads what a running pod holds from its limit variables (cluster/held.py).
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}))
    patched["spec"]["nodeName"] = "a1"
    use = pod_usage_of(patched)
    assert use is not None and (use.memory_mib, use.cores) == (20000, 0)


def test_memory_percentage_below_100_is_memory_only() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}))
    assert env(patched) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": f"{A100[1] // 4}m"}, NO_CAP]
    assert record(patched)["cores"] == 0


def test_memory_percentage_100_alone_is_the_whole_card() -> None:
    m, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100}))
    assert env(patched) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": f"{A100[1]}m"}]
    assert m.allocation is not None and m.allocation.cores == 100


def test_policy_cores_percent_caps_memory_only_slices() -> None:
    policy = parse_policy({"defaults": {"coresPercent": 20}})
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}), policy=policy)
    assert env(patched) == [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "4000m"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "20"},
    ]


PROPORTIONAL = parse_policy({"defaults": {"sliceDefaults": "proportional"}})


def test_proportional_slices_take_the_share_of_the_chosen_card_never_of_another() -> None:
    p = pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}, annotations={"nvidia.com/use-gputype": "A100"})
    share = -(-20000 * 100 // A100[1])  # 49 % of an A100's SMs
    for snap in (A100_ONLY, snapshot(node("a1", A100, 8), node("t1", T4, 4, "none"))):
        _, patched, _ = chain(p, snap, PROPORTIONAL)
        assert env(patched) == [
            {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "20000m"},
            {"name": "CUDA_DEVICE_SM_LIMIT", "value": str(share)},
        ]
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 25}), policy=PROPORTIONAL)
    assert env(patched) == [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": f"{A100[1] // 4}m"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "25"},
    ]


def test_mps_memory_only_pins_memory_and_sets_no_thread_percentage() -> None:
    policy = parse_policy({"defaults": {"backend": "mps"}})
    _, patched, _ = chain(pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4000}), policy=policy)
    assert env(patched) == [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=4000M,1=4000M"}]


def test_memory_only_slices_charge_no_compute_quota() -> None:
    # HAMi's fitQuota charges the container's cores, 0 for a memory-only slice.
    quota = {"team-a": (QuotaLimits("q", cores=100),)}
    snap = snapshot(node("a1", A100, 8), quotas=quota, used={"team-a": Usage(1, 0, 100)})
    m, _, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}), snap)
    assert m.allocation is not None and m.allocation.usage() == Usage(1, 3000, 0)


# --- cores only, cores 0, both memory forms ----------------------------------------------------------


def test_cores_only_gets_the_whole_memory_of_the_card_and_the_compute_cap() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30}))
    assert env(patched) == [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": f"{A100[1]}m"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"},
    ]


def test_cores_zero_is_a_best_effort_share_with_no_compute_cap() -> None:
    m, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 0}))
    assert env(patched) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "2000m"}, NO_CAP]
    assert m.allocation is not None and (m.allocation.memory_mib, m.allocation.cores) == (2000, 0)


def test_best_effort_share_stays_off_a_card_whose_compute_is_all_promised() -> None:
    # HAMi's Fit: "You can't allocate core=0 job to an already full GPU".
    busy = NodeUsage((GpuUsage(1000, 100, 2), GpuUsage()))
    snap = snapshot(node("a1", A100, 2), usage={"a1": busy})
    m, _, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 0}), snap)
    assert m.allocation is not None and m.allocation.gpus == (1,)


def test_absolute_memory_wins_over_the_percentage_with_a_warning() -> None:
    m, patched, _ = chain(
        pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpumem-percentage": 50})
    )
    assert env(patched) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "3000m"}, NO_CAP]
    assert m.warnings == (
        "container 'main' sets nvidia.com/gpumem and nvidia.com/gpumem-percentage; nvidia.com/gpumem applies",
    )
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


# --- each container its own slice --------------------------------------------------------------------


def two_containers(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    p = pod(first)
    p["spec"]["containers"].append({"name": "second", "image": "cuda:12", "resources": {"limits": second}})
    return p


def test_each_container_gets_its_own_slice_and_quota_counts_each() -> None:
    m, patched, v = chain(two_containers(
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30},
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000, "nvidia.com/gpucores": 50},
    ))
    assert env(patched, 0) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "3000m"},
                               {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}]
    assert env(patched, 1) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "10000m"},
                               {"name": "CUDA_DEVICE_SM_LIMIT", "value": "50"}]
    assert record(patched)["containers"] == [
        {"name": "main", "init": False, "gpus": 1, "memoryMiB": 3000, "cores": 30},
        {"name": "second", "init": False, "gpus": 1, "memoryMiB": 10000, "cores": 50},
    ]
    assert m.allocation is not None and m.allocation.usage() == Usage(2, 13000, 80)
    assert v.allocation == m.allocation


def test_per_container_slices_survive_the_record_both_ways() -> None:
    m, _, _ = chain(two_containers({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000},
                                   {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 40}))
    assert m.allocation is not None
    assert m.allocation.containers == (("main", False, 1, 3000, 0), ("second", False, 2, A100[1], 40))
    assert allocation_from_json(allocation_to_json(m.allocation)) == m.allocation
    wrong = [{"name": "main", "gpus": 1, "memoryMiB": 1, "cores": 101}]
    bad = {**allocation_to_json(m.allocation), "containers": wrong}
    with pytest.raises(ValueError, match=r"containers\[0\]\.cores: expected 0\.\.100, got 101"):
        allocation_from_json(bad)


def test_a_container_lifting_its_own_slice_to_another_containers_is_refused() -> None:
    _, patched, _ = chain(two_containers({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000},
                                         {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}))
    patched["spec"]["containers"][0]["env"][0]["value"] = "10000m"
    v = admit.validate(patched, A100_ONLY, Policy())
    assert (v.allowed, v.reason) == (False, "isolation-env")


def test_per_container_quota_admits_what_the_largest_slice_times_gpus_would_not() -> None:
    quota = {"team-a": (QuotaLimits("q", memory_mib=14000),)}
    snap = snapshot(node("a1", A100, 8), quotas=quota)
    chain(two_containers({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000},
                         {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}), snap)


# --- hami.io/gpu-scheduler-policy -----------------------------------------------------------------


BUSY_GPU0 = snapshot(node("a1", A100, 4), usage={"a1": NodeUsage((GpuUsage(4000, 0, 1),) + (GpuUsage(),) * 3)})


def _gpus(annotations: dict[str, str]) -> tuple[int, ...]:
    m, _, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}, annotations=annotations), BUSY_GPU0)
    assert m.allocation is not None
    return m.allocation.gpus


def test_binpack_shares_the_busy_gpu_and_mutex_takes_an_unused_one() -> None:
    assert _gpus({"hami.io/gpu-scheduler-policy": "binpack"}) == (0,)
    assert _gpus({"hami.io/gpu-scheduler-policy": "binpack,mutex"}) != (0,)
    assert _gpus({"hami.io/gpu-scheduler-policy": "mutex"}) != (0,)  # default order, unused GPUs only


def test_gpu_policy_comma_lists_are_read_as_hami_reads_them() -> None:
    m = admit.mutate(pod({"nvidia.com/gpu": 1}, annotations={"hami.io/gpu-scheduler-policy": "spread, numa"}),
                     A100_ONLY, Policy())
    assert m.allowed and m.warnings == ()
    unknown = admit.mutate(pod({"nvidia.com/gpu": 1}, annotations={"hami.io/gpu-scheduler-policy": "pack,spread"}),
                           A100_ONLY, Policy())
    assert unknown.allowed and unknown.warnings == (
        "hami.io/gpu-scheduler-policy: pack ignored (not binpack, spread, numa, topology-aware or mutex)",
    )


# --- device mode and NUMA annotations --------------------------------------------------------------


def test_device_mode_matching_the_backend_is_silent_and_another_mode_warns() -> None:
    silent = admit.mutate(pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/vgpu-mode": "hami-core"}),
                          A100_ONLY, Policy())
    assert silent.allowed and silent.warnings == ()
    mig = admit.mutate(pod({"nvidia.com/gpu": 1}, annotations={"volcano.sh/vgpu-mode": "mig"}), A100_ONLY, Policy())
    assert mig.allowed and mig.warnings == (
        "annotation volcano.sh/vgpu-mode='mig': limits are enforced with hami-core here",
    )


def test_numa_bind_on_several_gpus_warns_that_it_is_a_preference() -> None:
    m = admit.mutate(pod({"nvidia.com/gpu": 2}, annotations={"nvidia.com/numa-bind": "true"}), A100_ONLY, Policy())
    assert m.allowed and m.warnings == (
        "annotation nvidia.com/numa-bind: GPUs are chosen by link topology, which prefers one NUMA node",
    )


# --- other schedulers keep what they read ----------------------------------------------------------


def test_hami_scheduler_pod_keeps_gpumem_and_gpucores() -> None:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}
    _, patched, _ = chain(pod(limits, schedulerName="hami-scheduler"))
    assert patched["spec"]["containers"][0]["resources"] == {"limits": limits}
    assert env(patched) == [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "3000m"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"},
    ]
    assert "affinity" not in patched["spec"]


def test_hami_scheduler_pod_with_only_memory_gets_the_count_hami_would_add() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpumem": 3000}, schedulerName="hami-scheduler"))
    assert patched["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpumem": 3000, "nvidia.com/gpu": "1"}
    }


def test_kept_resources_changed_after_mutation_are_refused() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, schedulerName="hami-scheduler"))
    patched["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 30000
    v = admit.validate(patched, A100_ONLY, Policy())
    assert (v.allowed, v.reason) == (False, "annotation-mismatch")
    assert v.message.startswith("pod carries 30000 MiB of GPU memory in 'main', not the recorded 3000 next to its")


def test_volcano_containers_mixing_memory_forms_keep_their_own_figures() -> None:
    p = two_containers({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 2000},
                       {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory-percentage": 50})
    p["spec"]["schedulerName"] = "volcano"
    _, patched, _ = chain(p)
    assert env(patched, 0) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "2000m"}, NO_CAP]
    assert env(patched, 1) == [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": f"{A100[1] // 2}m"}, NO_CAP]


def test_kai_scheduler_pod_has_hami_fields_moved_out() -> None:
    # KAI reads none of HAMi's slice resources; no node advertises them to it.
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, schedulerName="kai-scheduler"))
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


# --- accelerators outside the vendor table -----------------------------------------------------------


def test_unknown_accelerator_passes_with_a_warning() -> None:
    for name in ("amd.com/gpu", "huawei.com/Ascend910", "metax-tech.com/gpu"):
        d = admit.mutate(pod({name: 1}), A100_ONLY, Policy())
        assert (d.allowed, d.patch, d.reason) == (True, (), "accelerator-not-counted")
        assert d.warnings == (f"container 'main': {name} is not counted or limited by this controller; left alone",)
