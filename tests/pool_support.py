"""Node pools that scale from zero as the cluster states them (Karpenter NodePools, Cluster API node
groups), the public manifests of `tests/fixtures/nodepools/`, and the pods that wait for them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from builders import pod, snapshot

from webhook.cluster.nodepools import pools_of
from webhook.core.domain.model import Node, Snapshot

FIXTURES = Path(__file__).parent / "fixtures"
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
AWS = "karpenter.k8s.aws/"


def fixture(name: str, folder: str = "nodepools") -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURES / folder / name).read_text()) if d]


def h100_nodepool(name: str = "h100", *, gpu_limit: int | None = 16, taints: Iterable[dict[str, str]] = (),
                  requirements: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """A NodePool of p5.48xlarge-like instances: 8 H100 GPUs of 80 GiB each, stated as Karpenter's
    well-known AWS requirements."""
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": {"team": "research"}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                "requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"]},
                    {"key": AWS + "instance-gpu-name", "operator": "In", "values": ["h100"]},
                    {"key": AWS + "instance-gpu-count", "operator": "In", "values": ["8"]},
                    {"key": AWS + "instance-gpu-memory", "operator": "In", "values": ["81920"]},
                    *requirements,
                ],
                "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}, *taints],
                "startupTaints": [{"key": "node.example.com/not-ready", "effect": "NoSchedule"}],
            },
        },
    }
    if gpu_limit is not None:
        spec["limits"] = {"nvidia.com/gpu": gpu_limit, "cpu": "2000"}
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec}


def training_pod(gpus: int = 8, selector: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A pod asking for `gpus` H100s through Karpenter's labels."""
    chosen = {AWS + "instance-gpu-name": "h100"} if selector is None else selector
    return pod({"nvidia.com/gpu": gpus}, nodeSelector=chosen, tolerations=list(TOLERATE_GPU), **extra)


def with_pools(objects: Iterable[dict[str, Any]], *nodes: Node) -> Snapshot:
    """A snapshot of `nodes` (team-a managed) with the pools the objects state."""
    return dataclasses.replace(snapshot(*nodes), scale_pools=pools_of(objects, nodes))
