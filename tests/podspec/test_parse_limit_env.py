"""Limit variables in a pod that carries the decision record: the ones the record dictates are the
webhook's own (exempt), whatever their order; the same variables set by hand in a pod without a record
bypass isolation; and a container that only sets them still makes the pod a GPU pod."""

from __future__ import annotations

from typing import Any

from webhook.core.domain.names import ALLOCATION
from webhook.core.podspec.resources import parse_pod


def _pod(env: list[dict[str, Any]], *, record: bool, gpu: bool = True) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
    annotations = {ALLOCATION: "{}"} if record else {}
    return {"metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": resources, "env": env}]}}


LIMIT = {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1000m"}


def test_the_recorded_limits_are_exempt_in_a_gpu_container() -> None:
    request = parse_pod(_pod([LIMIT, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}], record=True))
    assert request.is_gpu_pod and request.violations == ()


def test_a_limit_from_a_reference_is_exempt_when_a_literal_entry_of_the_same_name_follows() -> None:
    by_reference = {"name": "CUDA_DEVICE_SM_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
    request = parse_pod(_pod([by_reference, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}], record=True))
    assert request.violations == ()
    alone = parse_pod(_pod([by_reference], record=True))
    assert [v.rule for v in alone.violations] == ["isolation-env"]


def test_without_a_record_a_limit_set_by_hand_is_refused() -> None:
    request = parse_pod(_pod([LIMIT], record=False))
    assert [(v.rule, v.code) for v in request.violations] == [("isolation-env", 403)]
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" in request.violations[0].message


def test_a_container_that_only_sets_a_limit_makes_a_gpu_pod() -> None:
    request = parse_pod(_pod([LIMIT], record=False, gpu=False))
    assert request.is_gpu_pod and [v.rule for v in request.violations] == ["isolation-env"]
    assert not parse_pod(_pod([{"name": "PATH", "value": "/bin"}], record=False, gpu=False)).is_gpu_pod


def test_other_bypass_variables_are_refused_next_to_the_recorded_limits() -> None:
    request = parse_pod(_pod([LIMIT, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], record=True))
    assert [v.rule for v in request.violations] == ["isolation-env"]
    assert "NVIDIA_VISIBLE_DEVICES" in request.violations[0].message
