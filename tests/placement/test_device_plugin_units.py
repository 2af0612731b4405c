"""A node's `nvidia.com/gpu` allocatable is what the scheduler counts: without HAMi's split or
time-slicing replicas one unit per card, taken whole by each pod however small its share. Placement
never plans a pod onto a node whose units are all requested, where the scheduler would not bind it."""

from __future__ import annotations

import json
from typing import Any

from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.policy.model import Policy

H100 = "NVIDIA-H100-80GB-HBM3"
POLICY = Policy(managed_namespaces="all")


def node(name: str, cards: int, units: int) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": str(cards),
              "nvidia.com/gpu.memory": "81559"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(units)}}}


def shared_pod(name: str, node_name: str | None = None, memory: int = 10000) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a", "uid": name},
            "spec": spec, "status": {"phase": "Running"}}


def planned_node(objects: list[dict[str, Any]]) -> str:
    decision = admit.mutate(shared_pod("new"), build_snapshot(objects), POLICY, namespace="team-a",
                            record_key=b"k" * 32)
    assert decision.allowed, decision.message
    assert decision.allocation is not None and decision.allocation.node
    record = next(op["value"] for op in decision.patch if op["path"].startswith("/metadata/annotations"))
    record = record if isinstance(record, str) else record["gpu-admission.io/allocation"]
    assert json.loads(record)["node"] == decision.allocation.node  # what the pod's record says
    return decision.allocation.node


def test_a_node_whose_units_are_all_requested_is_not_planned_on_however_much_memory_is_left() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    # "busy" has two cards and two units, both requested by small shares on one card: memory is left, units
    # are not. "spare" has room. Binpacking prefers the fuller node, which the scheduler would not bind to.
    full = [shared_pod("a", "busy"), shared_pod("b", "busy")]
    snap = build_snapshot([namespace, node("busy", 2, 2), node("spare", 2, 2), *full])
    assert snap.nodes["busy"].gpu_units == 2
    assert planned_node([namespace, node("busy", 2, 2), node("spare", 2, 2), *full]) == "spare"
    # The same node split into 20 units (HAMi's device plugin, time-slicing replicas): shares pack there.
    assert planned_node([namespace, node("busy", 2, 20), node("spare", 2, 20), *full]) == "busy"


def test_with_every_node_out_of_units_the_pod_waits_for_one() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    objects = [namespace, node("only", 2, 2), shared_pod("a", "only"), shared_pod("b", "only")]
    decision = admit.mutate(shared_pod("new"), build_snapshot(objects), POLICY, namespace="team-a",
                            record_key=b"k" * 32)
    # The policy's default for a full cluster: admitted without a node, to wait for one (never planned
    # onto the node the scheduler will not bind it to).
    assert decision.allowed and decision.message == "no node free now"
    assert decision.allocation is not None and not decision.allocation.node
