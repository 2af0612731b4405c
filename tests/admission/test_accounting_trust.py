"""Accounting never trusts a field the pod's owner can edit: what a running or pending pod counts comes
from its resources and the limit variables in its container env (both immutable), never from the
decision annotation, which any update can rewrite without the webhook seeing it."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from server_support import cluster_objects

from webhook.cluster.cache import ClusterCache
from webhook.cluster.held import Held, held_of, limit_mib
from webhook.cluster.podusage import pod_usage_of
from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.domain.model import GpuUsage, Snapshot, Usage
from webhook.core.podspec.record import ANNOTATION
from webhook.core.podspec.resources import parse_pod
from webhook.core.policy.model import Policy, parse_policy

H100_MIB = 81559


def admitted(name: str, limits: dict[str, Any], node: str = "gpu-a", phase: str = "Running") -> dict[str, Any]:
    """A pod as the API server stores it after both webhooks, bound to `node`."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
           "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}}
    snap = build_snapshot(cluster_objects())
    decision = admit.mutate(pod, snap, Policy())
    assert decision.allowed, decision.message
    final = jsonpatch.apply_patch(pod, [dict(op) for op in decision.patch])
    final["metadata"]["uid"] = f"uid-{name}"
    assert admit.validate(final, snap, Policy()).allowed
    final["spec"]["nodeName"] = node
    final["status"] = {"phase": phase}
    return final


def edited(pod: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The pod after its owner rewrote the record (an UPDATE the webhook never sees)."""
    result = copy.deepcopy(pod)
    record = json.loads(result["metadata"]["annotations"][ANNOTATION])
    record.update(changes)
    result["metadata"]["annotations"][ANNOTATION] = json.dumps(record)
    return result


def cache_of(objects: list[dict[str, Any]]) -> ClusterCache:
    cache = ClusterCache()
    by_kind = {"Node": "nodes", "Namespace": "namespaces", "ResourceQuota": "resourcequotas", "Pod": "pods"}
    for kind, plural in by_kind.items():
        cache.replace(plural, [o for o in objects if o.get("kind") == kind])
    return cache


SLICE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "40"}


def test_rewriting_a_running_pods_record_frees_nothing() -> None:
    pod = admitted("train", SLICE)
    cache = cache_of([*cluster_objects(quota_gpus=8), pod])
    before = cache.snapshot()
    assert before.namespace_usage["team-a"] == Usage(1, 20000, 40)
    for changes in ({"memoryMiB": 0, "cores": 0}, {"gpuCount": 0, "gpus": []}, {"node": "gpu-b", "gpus": [3]},
                    {"vendor": "hygon"}):
        cache.apply("pods", "MODIFIED", edited(pod, **changes))
        after = cache.snapshot()
        assert after.namespace_usage == before.namespace_usage, changes
        assert sum(g.memory_mib for g in after.usage["gpu-a"].gpus) == 20000, changes
        assert after.usage["gpu-b"] == before.usage["gpu-b"], changes
        assert build_snapshot([*cluster_objects(quota_gpus=8), edited(pod, **changes)]).namespace_usage == \
            before.namespace_usage


def test_pods_that_merely_carry_a_record_hold_no_gpu() -> None:
    # Enough of them once made every GPU look taken: in an unmanaged namespace, no GPU resource at all.
    record = json.dumps({"version": 1, "node": "gpu-a", "gpus": list(range(8)), "gpuCount": 8, "memoryMiB": H100_MIB,
                         "cores": 100, "vendor": "nvidia", "topology": "nvlink"})
    squatters = [{"kind": "Pod", "metadata": {"name": f"s{i}", "namespace": "sandbox", "uid": f"s{i}",
                                              "annotations": {ANNOTATION: record}},
                  "spec": {"nodeName": "gpu-a", "containers": [{"name": "c", "image": "busybox"}]},
                  "status": {"phase": "Running"}} for i in range(20)]
    snap = cache_of([*cluster_objects(), *squatters]).snapshot()
    assert snap.usage["gpu-a"].gpus == (GpuUsage(),) * 8 and snap.namespace_usage == {}
    assert build_snapshot([*cluster_objects(), *squatters]).usage["gpu-a"].gpus == (GpuUsage(),) * 8


def test_a_gpu_container_without_limit_variables_counts_whole_cards() -> None:
    # A record claiming a 1 MiB slice on a pod whose container nothing limits: it can use the whole card.
    record = json.dumps({"version": 1, "node": "gpu-a", "gpus": [0], "gpuCount": 1, "memoryMiB": 1, "cores": 1,
                         "vendor": "nvidia"})
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "team-a", "annotations": {ANNOTATION: record}},
           "spec": {"nodeName": "gpu-a", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
           "status": {"phase": "Running"}}
    use = pod_usage_of(pod)
    assert use is not None
    assert (use.gpus, use.count, use.exclusive, use.memory_on(H100_MIB)) == ((0,), 1, True, H100_MIB)


def test_the_record_places_the_usage_only_where_it_agrees_with_the_pod() -> None:
    pod = admitted("train", SLICE)
    use = pod_usage_of(pod)
    assert use is not None and (use.node, use.gpus, use.memory_mib, use.cores) == ("gpu-a", (0,), 20000, 40)
    for changes, indices in (({"gpus": [3]}, (3,)), ({"gpus": [0, 1]}, None), ({"gpus": [9]}, (9,)),
                             ({"gpuCount": 2}, None)):
        moved = pod_usage_of(edited(pod, **changes))
        assert moved is not None and (moved.node, moved.gpus, moved.count, moved.memory_mib) == \
            ("gpu-a", indices, 1, 20000), changes


def limits_of(env: dict[str, str], limits: dict[str, Any] | None = None) -> Held | None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": limits or {"nvidia.com/gpu": 2}},
         "env": [{"name": k, "value": v} for k, v in env.items()]}]}}
    return held_of(parse_pod(pod))


def test_limit_variables_read_as_the_limit_layers_read_them() -> None:
    assert limit_mib("3000m") == 3000 and limit_mib("3g") == 3072 and limit_mib("2048k") == 2
    assert limit_mib("0m") is None and limit_mib("lots") is None and limit_mib(str(5 * 1024 * 1024)) == 5
    assert limits_of({}) is None
    assert limits_of({"CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "1000m",
                      "CUDA_DEVICE_SM_LIMIT": "25"}) == Held(1000, 25)
    # GPU 1 has no limit of its own and no fallback: HAMi-core leaves it uncapped.
    assert limits_of({"CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", "CUDA_DEVICE_SM_LIMIT": "25"}) == Held(None, 100)
    assert limits_of({"CUDA_DEVICE_MEMORY_LIMIT": "2g"}) == Held(2048, 100)
    assert limits_of({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                      "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M,1=4000M"}) == Held(4000, 30)
    assert limits_of({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                      "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M"}) == Held(None, 100)
    # Best effort (gpucores 0): hami-core writes CUDA_DEVICE_SM_LIMIT=0, MPS leaves the percentage out.
    assert limits_of({"CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "1000m",
                      "CUDA_DEVICE_SM_LIMIT": "0"}) == Held(1000, 0)
    assert limits_of({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M,1=4000M"}) == Held(4000, 0)


@pytest.mark.parametrize("backend", ["hami-core", "mps"])
@pytest.mark.parametrize("limits", [
    {"nvidia.com/gpu": "2"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "40"},
    {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "0"},
    {"nvidia.com/gpumem": "30000"},
])
def test_a_running_pod_counts_what_its_admission_charged(
    backend: str, limits: dict[str, str], live_snapshot: Snapshot
) -> None:
    policy = parse_policy({"defaults": {"backend": backend}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
           "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}}
    snap = live_snapshot
    decision = admit.mutate(pod, snap, policy)
    assert decision.allowed and decision.allocation is not None, decision.message
    final = jsonpatch.apply_patch(pod, [dict(op) for op in decision.patch])
    final["spec"]["nodeName"] = decision.allocation.node
    final["status"] = {"phase": "Running"}
    use = pod_usage_of(final)
    assert use is not None
    charged = Usage(use.count, use.memory_on(H100_MIB) * use.count, use.cores * use.count)
    assert charged == decision.allocation.usage()
