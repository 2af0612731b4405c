"""A share asked by KAI annotation (`gpu-fraction`, `gpu-memory`) is counted from what the pod cannot
change: the annotation can be edited or removed on a running pod, so for the default scheduler the
mutation adds the device count to the container the share belongs to, and for kai-scheduler (which would
read that count as whole GPUs) accounting reads the per-device limit variables the mutation wrote."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jsonpatch
import pytest
from builders import A100, node, pod, snapshot

from webhook.cluster.podusage import pod_usage_of
from webhook.core.admission import admit
from webhook.core.podspec.resources import parse_pod
from webhook.core.policy.model import Policy, parse_policy

CLUSTER = snapshot(node("a1", A100, 8))
KEY = b"k" * 32
HALF = A100[1] // 2
KAI = {"schedulerName": "kai-scheduler"}


def chain(p: dict[str, Any], policy: Policy | None = None) -> tuple[Any, dict[str, Any]]:
    policy = policy or Policy()
    m = admit.mutate(p, CLUSTER, policy, record_key=KEY)
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    v = admit.validate(patched, CLUSTER, policy, record_key=KEY)
    assert v.allowed and v.allocation == m.allocation, v.message
    again = admit.mutate(patched, CLUSTER, policy, record_key=KEY)
    assert (again.allowed, again.patch, again.allocation) == (True, (), m.allocation)  # re-invocation: no-op
    patched["spec"]["nodeName"] = "a1"
    return m, patched


def two_containers(annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    p = pod(annotations=annotations, **spec)
    p["spec"]["containers"].append({"name": "gpu", "image": "cuda:12"})
    return p


@pytest.mark.parametrize("annotations", [{"gpu-fraction": "0.5"}, {"gpu-memory": "2000"},
                                         {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}])
def test_default_scheduler_gets_the_device_count(annotations: dict[str, str]) -> None:
    _, patched = chain(pod(annotations=annotations))
    count = annotations.get("gpu-fraction-num-devices", "1")
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": count}}


def test_the_count_goes_to_the_container_named_for_the_share() -> None:
    _, patched = chain(two_containers({"gpu-fraction": "0.5", "gpu-fraction-container-name": "gpu"}))
    main, gpu = patched["spec"]["containers"]
    assert "resources" not in main
    assert gpu["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": f"{HALF}m"} in gpu["env"]


def test_kai_scheduler_gets_no_device_count() -> None:
    _, patched = chain(pod(annotations={"gpu-fraction": "0.5"}, **KAI))
    assert "resources" not in patched["spec"]["containers"][0]  # KAI would read it as a whole GPU


@pytest.mark.parametrize("scheduler", [{}, KAI])
@pytest.mark.parametrize("annotations", [{"gpu-fraction": "0.5"}, {"gpu-memory": "2000"},
                                         {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}])
@pytest.mark.parametrize("edit", [
    lambda a: a.pop("gpu-fraction", None) or a.pop("gpu-memory", None),
    lambda a: a.clear(),
    lambda a: a.update({"gpu-fraction": "0.01"}) if "gpu-fraction" in a else a.update({"gpu-memory": "1"}),
    lambda a: a.update({"gpu-fraction-num-devices": "1"}),
])
def test_editing_the_annotation_of_a_running_pod_changes_nothing(scheduler: dict[str, str],
                                                                annotations: dict[str, str], edit: Any) -> None:
    m, running = chain(pod(annotations=dict(annotations), **scheduler))
    before = pod_usage_of(running)
    count = int(annotations.get("gpu-fraction-num-devices", "1"))
    memory = HALF if "gpu-fraction" in annotations else 2000
    assert before is not None and (before.node, before.count, before.memory_mib) == ("a1", count, memory)
    edited = copy.deepcopy(running)
    edit(edited["metadata"]["annotations"])
    after = pod_usage_of(edited)
    # Only which GPUs of the node can move (the record says that, and clear() removes it too).
    assert after is not None and after == dataclasses.replace(before, gpus=after.gpus)


def test_a_user_count_that_disagrees_with_the_annotation_is_still_a_conflict() -> None:
    request = parse_pod(pod({"nvidia.com/gpu": 2}, annotations={"gpu-fraction": "0.5"}))
    assert [v.rule for v in request.violations] == ["dialect-conflict"]
    request = parse_pod(pod({"nvidia.com/gpu": 1}, annotations={"gpu-fraction": "0.5"}, **KAI))
    assert [v.rule for v in request.violations] == ["dialect-conflict"]


def test_kai_scheduler_without_limit_variables_falls_back_to_the_annotation() -> None:
    # Backend none writes no variable: nothing immutable records the share, so the annotation is read.
    _, running = chain(pod(annotations={"gpu-fraction": "0.5"}, **KAI),
                       parse_policy({"defaults": {"backend": "none"}}))
    use = pod_usage_of(running)
    assert use is not None and (use.count, use.memory_pct) == (1, 50)


@pytest.mark.parametrize("scheduler", [{}, KAI])
def test_the_watch_cache_still_counts_a_pod_stripped_of_every_annotation(scheduler: dict[str, str]) -> None:
    from webhook.cluster.cache import ClusterCache

    _, running = chain(pod(annotations={"gpu-fraction": "0.5"}, **scheduler))
    running["metadata"]["annotations"] = {}  # the share and the decision record both removed
    running["status"] = {"phase": "Running"}
    cache = ClusterCache(clock=lambda: 0.0)
    cache.replace("pods", [running])
    usage = cache.snapshot().namespace_usage["team-a"]
    assert (usage.gpus, usage.memory_mib) == (1, HALF)
