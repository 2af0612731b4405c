"""A group's stated size is a promise that holds its domain against other groups: it is cut to the pods
the namespace's GPU quota could ever add, so pods stating a size they cannot reach hold nothing beyond it."""

from __future__ import annotations

from group_support import cliques_cache, placed, ref

from webhook.cluster.source import LiveSource
from webhook.core.placement.groups import GroupRef, commit


def quota(cache_namespace: str, gpus: int) -> dict[str, object]:
    return {
        "metadata": {"name": "gpu", "namespace": cache_namespace},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
    }


def source_with_quota(gpus: int | None) -> LiveSource:
    cache = cliques_cache({"a": 3})  # one clique of 12 GPUs
    if gpus is not None:
        cache.replace("resourcequotas", [quota("team-a", gpus)])
    return LiveSource(cache)


def promise_of_two_one_gpu_pods_stating_sixteen(source: LiveSource) -> None:
    group = GroupRef("team-a", "lws/promise", 16, "leaderworkerset.sigs.k8s.io/size")
    for i in range(2):
        decided = source.commit(f"promise-{i}", "team-a", placed(group, "a", "a-n0", gpus=1), False, group=group)
        assert decided.allowed, decided.message


def test_a_promise_beyond_the_namespaces_quota_does_not_hold_another_tenants_job_out() -> None:
    source = source_with_quota(4)
    promise_of_two_one_gpu_pods_stating_sixteen(source)
    job = ref("train", size=2, namespace="team-b")  # 2 x 4 GPUs
    decided = source.commit("train-0", "team-b", placed(job, "a", "a-n1"), False, group=job)
    assert decided.allowed, decided.message


def test_without_a_quota_the_promise_holds_as_stated() -> None:
    source = source_with_quota(None)
    promise_of_two_one_gpu_pods_stating_sixteen(source)
    job = ref("train", size=2, namespace="team-b")
    decided = source.commit("train-0", "team-b", placed(job, "a", "a-n1"), False, group=job)
    assert (decided.allowed, decided.reason) == (False, "group-domain-taken")
    assert "hold 14 of them" in decided.message


def test_the_cut_keeps_every_pod_the_quota_allows() -> None:
    group = GroupRef("team-a", "lws/x", 16, "leaderworkerset.sigs.k8s.io/size")
    record = commit({}, group, "nvidia.com/gpu.clique", "a", 2, "m0", quota_room=6)
    assert not isinstance(record, str)
    assert (record.size, record.promised_gpus) == (4, 6)  # this pod and three more of 2 GPUs
    unbounded = commit({}, group, "nvidia.com/gpu.clique", "a", 2, "m0")
    assert not isinstance(unbounded, str) and unbounded.size == 16
    exhausted = commit({}, group, "nvidia.com/gpu.clique", "a", 2, "m0", quota_room=0)
    assert not isinstance(exhausted, str) and (exhausted.size, exhausted.promised_gpus) == (1, 0)
