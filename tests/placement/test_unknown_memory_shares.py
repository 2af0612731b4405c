"""A slice of a card whose memory no one states (a product label, no `nvidia.com/gpu.memory`, no
inventory) cannot be bounded: HAMi-core reads a zero limit as none, so several such pods would share the
card with no memory cap. A slice asked as a percentage or as compute alone is refused with what is
missing, as one asked in MiB is; a whole card is admitted (it needs no memory limit)."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.policy.model import Policy

POLICY = Policy(managed_namespaces="all")
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "t4-0", "labels": {
    "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "4"}},
    "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
SNAP = build_snapshot([NODE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}])


def pod(**limits: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": "1", **limits}}}]}}


@pytest.mark.parametrize("limits", [{"nvidia.com/gpumem-percentage": "50"}, {"nvidia.com/gpucores": "30"},
                                    {"nvidia.com/gpumem": "4000"}])
def test_a_slice_of_a_card_of_unknown_memory_is_refused_naming_what_is_missing(limits: dict[str, str]) -> None:
    decision = admit.mutate(pod(**limits), SNAP, POLICY, namespace="team-a", record_key=b"k" * 32)
    assert not decision.allowed and decision.code == 422 and decision.reason == "memory-too-large"
    assert "nvidia.com/gpu.memory label" in decision.message and "is unknown" in decision.message


def test_a_whole_card_of_unknown_memory_is_admitted_without_a_memory_limit() -> None:
    decision = admit.mutate(pod(), SNAP, POLICY, namespace="team-a", record_key=b"k" * 32)
    assert decision.allowed and decision.allocation is not None and decision.allocation.node == "t4-0"
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in str(decision.patch)
