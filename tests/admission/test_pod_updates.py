"""Pod UPDATEs that could reach a GPU, judged as the same pod would have been at CREATE."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import pod
from isolation_support import SNAP, VOID, answer, chain, cpu_pod, update_review

from webhook.core.admission.updates import SCHEDULING_ANNOTATIONS, pod_update
from webhook.core.policy.model import Policy

GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def with_spec(p: dict[str, Any], **spec: Any) -> dict[str, Any]:
    changed = copy.deepcopy(p)
    changed["spec"].update(spec)
    return changed


def with_annotations(p: dict[str, Any], **annotations: str) -> dict[str, Any]:
    changed = copy.deepcopy(p)
    changed["metadata"].setdefault("annotations", {}).update(annotations)
    return changed


@pytest.mark.parametrize(
    "route", [{"tolerations": [GPU_TAINT]}, {"tolerations": [{"operator": "Exists"}]}, {"nodeSelector": {"x": "y"}}]
)
def test_a_pod_without_gpus_that_gains_a_route_to_a_gpu_node_is_refused(route: dict[str, Any]) -> None:
    old = cpu_pod()
    new = with_spec(old, **route)
    decision = pod_update(new, old, SNAP, Policy())
    if "nodeSelector" in route:  # a selector no GPU node carries narrows: nothing reached
        assert decision.allowed
        return
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "gpu-reachable")
    assert "this update gives a pod that asks for no GPU a way onto a GPU node" in decision.message
    assert "NVIDIA_VISIBLE_DEVICES=void" in decision.message


def test_the_same_route_passes_when_every_container_already_carries_void() -> None:
    old = cpu_pod({"name": "app", "image": "cuda", "env": [VOID]})
    assert pod_update(with_spec(old, tolerations=[GPU_TAINT]), old, SNAP, Policy()).allowed


def test_a_zero_count_pod_gaining_a_toleration_is_refused_too() -> None:
    old = cpu_pod({"name": "app", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "0"}}})
    decision = pod_update(with_spec(old, tolerations=[GPU_TAINT]), old, SNAP, Policy())
    assert (decision.allowed, decision.reason) == (False, "gpu-reachable")


def test_a_pod_that_could_already_reach_a_gpu_is_not_refused_for_an_unrelated_toleration() -> None:
    old = cpu_pod(nodeName="h1")  # predates the webhook: it never got void
    new = with_spec(old, tolerations=[{"key": "example.com/maintenance", "operator": "Exists"}])
    assert pod_update(new, old, SNAP, Policy()).allowed


def test_a_gpu_pod_may_gain_tolerations_and_node_constraints() -> None:
    _, admitted, validated = chain(pod({"nvidia.com/gpu": 1}))
    assert validated.allowed
    new = with_spec(admitted, tolerations=[*admitted["spec"].get("tolerations", []), GPU_TAINT],
                    nodeSelector={"kueue.x-k8s.io/flavor": "h100"})
    assert pod_update(new, admitted, SNAP, Policy()).allowed


@pytest.mark.parametrize("name", sorted(SCHEDULING_ANNOTATIONS))
def test_annotations_that_ask_for_or_choose_gpus_are_fixed_after_admission(name: str) -> None:
    for old in (cpu_pod(), chain(pod({"nvidia.com/gpu": 1}))[1]):
        decision = pod_update(with_annotations(old, **{name: "0.5"}), old, SNAP, Policy())
        assert (decision.allowed, decision.code, decision.reason) == (False, 403, "gpu-request-changed")
        assert name in decision.message


def test_label_and_other_annotation_edits_pass() -> None:
    _, admitted, _ = chain(pod({"nvidia.com/gpu": 1}))
    edited = with_annotations(admitted, **{"example.com/owner": "ml", "hami.io/bind-phase": "success"})
    edited["metadata"]["labels"] = {"team": "ml"}
    assert pod_update(edited, admitted, SNAP, Policy()).allowed


def test_the_validating_webhook_answers_pod_updates_with_the_same_rule() -> None:
    old = cpu_pod()
    old["metadata"]["uid"] = "uid-web"
    refused = answer("/validate", update_review(old, with_spec(old, tolerations=[GPU_TAINT])))
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    passed = answer("/validate", update_review(old, with_spec(old, tolerations=[{"key": "a", "operator": "Exists"}])))
    assert passed["allowed"] is True
