"""The decision record is the product's word, never the user's.

A record the webhook did not seal (written or edited by the pod's author, copied to another namespace or
shape, sealed under another key) changes nothing: the pod is decided exactly as without it, or refused.
Re-invocation on the webhook's own output stays a no-op. Mirror pods pass only from their node.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from builders import A100, H100, L4, node, pod, snapshot

from webhook.core.admission import admit
from webhook.core.domain.model import QuotaLimits
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import Policy, parse_policy

CLUSTER = snapshot(node("h1", H100, 8), node("a1", A100, 8, "paired"), node("l1", L4, 2, "none"))
KEY = b"k" * 32


def forged(memory: int = 0, cores: int = 0, node_name: str = "h1", gpus: int = 1) -> str:
    return json.dumps({"version": 1, "node": node_name, "gpus": list(range(gpus)), "uuids": [], "gpuCount": gpus,
                       "memoryMiB": memory, "cores": cores, "vendor": "nvidia", "model": H100[0],
                       "topology": "single", "loss": 0.0, "policy": "binpack"})


def apply(p: dict[str, Any], ops: Any) -> dict[str, Any]:
    return jsonpatch.apply_patch(p, [dict(op) for op in ops])


DEFAULT = Policy()


def chain(p: dict[str, Any], snap: Any = CLUSTER, policy: Policy = DEFAULT, key: bytes = KEY):
    m = admit.mutate(p, snap, policy, record_key=key)
    assert m.allowed, m.message
    patched = apply(p, m.patch)
    patched["metadata"]["uid"] = "uid-1"
    return m, patched, admit.validate(patched, snap, policy, record_key=key)


WHOLE = {"nvidia.com/gpu": 1}
SLICE = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}


@pytest.mark.parametrize("limits", [WHOLE, SLICE, {"nvidia.com/gpu": 2}])
@pytest.mark.parametrize("record", [forged(0, 0), forged(1, 1), "{not json", forged(0, 0, gpus=2)])
def test_a_forged_record_changes_nothing_at_mutation(limits: dict[str, Any], record: str) -> None:
    plain = pod(limits)
    carrying = pod(limits, annotations={ANNOTATION: record})
    m_plain = admit.mutate(plain, CLUSTER, Policy(), record_key=KEY)
    m_forged = admit.mutate(carrying, CLUSTER, Policy(), record_key=KEY)
    assert m_forged.allowed and m_forged.allocation == m_plain.allocation
    # The same pod after the patch: the same limits, and the forged record replaced by the sealed one.
    assert apply(carrying, m_forged.patch) == apply(plain, m_plain.patch)


def test_a_forged_record_cannot_carry_limits_that_lift_the_cap() -> None:
    lifted = [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "0m"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]
    carrying = pod(WHOLE, annotations={ANNOTATION: forged(0, 0)}, env=lifted)
    plain = pod(WHOLE, env=lifted)
    for decide in (admit.mutate, admit.validate):
        with_record = decide(carrying, CLUSTER, Policy(), record_key=KEY)
        assert not with_record.allowed and with_record.code == 403
    without = admit.mutate(plain, CLUSTER, Policy(), record_key=KEY)
    assert admit.mutate(carrying, CLUSTER, Policy(), record_key=KEY) == without
    assert without.reason == "isolation-env"


def test_validation_refuses_a_hand_made_final_pod() -> None:
    # What the mutation would have written for a 0 MiB, 0 % slice, but without the webhook's seal.
    lifted = [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "0m"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]
    final = pod(WHOLE, annotations={ANNOTATION: forged(0, 0)}, env=lifted,
                tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    v = admit.validate(final, CLUSTER, Policy(), record_key=KEY)
    assert (v.allowed, v.code, v.reason) == (False, 403, "annotation-not-sealed")
    assert "seal does not verify" in v.message


@pytest.mark.parametrize("edit", [{"memoryMiB": 1}, {"cores": 0}, {"gpus": [5]}, {"node": "l1"}, {"seal": "0" * 32}])
def test_an_edited_record_is_no_record(edit: dict[str, Any]) -> None:
    m, patched, v = chain(pod(SLICE))
    assert v.allowed
    record = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    record.update(edit)
    patched["metadata"]["annotations"][ANNOTATION] = json.dumps(record)
    v = admit.validate(patched, CLUSTER, Policy(), record_key=KEY)
    assert (v.allowed, v.reason) == (False, "annotation-not-sealed")
    # Mutating it again judges it without the record: its limit variables are then the user's own.
    again = admit.mutate(patched, CLUSTER, Policy(), record_key=KEY)
    assert (again.allowed, again.reason) == (False, "isolation-env")


@pytest.mark.parametrize("limits", [WHOLE, SLICE, {"nvidia.com/gpu": 4}, {"nvidia.com/gpumem-percentage": 50}])
def test_reinvocation_on_the_webhooks_own_output_is_a_no_op(limits: dict[str, Any]) -> None:
    m, patched, v = chain(pod(limits))
    assert v.allowed and v.allocation == m.allocation
    again = admit.mutate(patched, CLUSTER, Policy(), record_key=KEY)
    assert (again.allowed, again.patch, again.allocation) == (True, (), m.allocation)


def test_a_record_does_not_move_to_another_namespace_key_or_shape() -> None:
    _, patched, _ = chain(pod(SLICE))
    elsewhere = copy.deepcopy(patched)
    elsewhere["metadata"]["namespace"] = "team-b"
    assert admit.validate(elsewhere, CLUSTER, Policy(), record_key=KEY).reason == "annotation-not-sealed"
    assert admit.validate(patched, CLUSTER, Policy(), record_key=b"x" * 32).reason == "annotation-not-sealed"
    wider = copy.deepcopy(patched)
    wider["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 2
    assert admit.validate(wider, CLUSTER, Policy(), record_key=KEY).reason == "annotation-not-sealed"


def test_a_copied_record_brings_back_the_node_requirement() -> None:
    # Pod A is admitted on an L4-sized slice; its author copies A's record and limits into pod B,
    # leaving out the node affinity the mutation wrote into A.
    _, a, _ = chain(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}))
    b = copy.deepcopy(a)
    del b["spec"]["affinity"]
    v = admit.validate(b, CLUSTER, Policy(), record_key=KEY)
    assert (v.allowed, v.reason) == (False, "affinity-changed")
    m = admit.mutate(b, CLUSTER, Policy(), record_key=KEY)
    assert m.allowed and [op["path"] for op in m.patch] == ["/spec/affinity"]
    restored = apply(b, m.patch)
    assert restored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == \
        a["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert admit.validate(restored, CLUSTER, Policy(), record_key=KEY).allowed


def test_a_forged_record_is_charged_nothing_less_against_the_quota() -> None:
    quota = {"team-a": (QuotaLimits("mem", memory_mib=50000),)}
    snap = snapshot(node("h1", H100, 8), quotas=quota)
    carrying = pod(WHOLE, annotations={ANNOTATION: forged(0, 0)})
    m = admit.mutate(carrying, snap, Policy(), record_key=KEY)
    assert (m.allowed, m.reason) == (False, "quota-exceeded")  # a whole H100 is 81559 MiB


def test_unmanaged_and_non_gpu_pods_with_a_forged_record_are_what_they_would_be_without() -> None:
    for p, reason in ((pod(WHOLE, namespace="sandbox", annotations={ANNOTATION: forged()}), "not-managed"),
                      (pod({"cpu": "1"}, annotations={ANNOTATION: forged(gpus=8)}), "not-gpu-pod")):
        for decide in (admit.mutate, admit.validate):
            d = decide(p, CLUSTER, Policy(), record_key=KEY)
            assert (d.allowed, d.reason, d.patch) == (True, reason, ())


@pytest.mark.parametrize("backend", ["hami-core", "mps", "none"])
@pytest.mark.parametrize(("limits", "scheduler"), [
    (SLICE, {}),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, {"schedulerName": "volcano"}),
    ({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 3000}, {"schedulerName": "volcano"}),
])
def test_every_backend_and_scheduler_seals_and_reinvokes_cleanly(backend: str, limits: dict[str, Any],
                                                                 scheduler: dict[str, str]) -> None:
    policy = parse_policy({"defaults": {"backend": backend}})
    m, patched, v = chain(pod(limits, **scheduler), policy=policy)
    assert v.allowed and v.allocation == m.allocation
    assert admit.mutate(patched, CLUSTER, policy, record_key=KEY).patch == ()
    forged_pod = pod(limits, annotations={ANNOTATION: forged(1, 1)}, **scheduler)
    forged_m = admit.mutate(forged_pod, CLUSTER, policy, record_key=KEY)
    assert forged_m.allocation == m.allocation
    assert apply(forged_pod, forged_m.patch) == apply(pod(limits, **scheduler), m.patch)
