"""A new pod's usage is added onto its node's sum instead of summing the node anew: the result must be
what the whole sum gives, whatever mix of recorded indices, copied records, pods without records and
host-only pods came before, and after deletes and re-adds."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from webhook.cluster.cache import ClusterCache
from webhook.cluster.translate import build_snapshot

DATA = Path(__file__).parent.parent / "data" / "watch"
NODES = {"gpu-a": 4, "gpu-b": 2}


def listed(kind: str, item_kind: str) -> list[dict[str, Any]]:
    items = json.loads((DATA / f"{kind}.list1.json").read_text())["items"]
    return [{"kind": item_kind, **o} for o in items]


def gpu_pod(rng: random.Random, name: str) -> dict[str, Any]:
    node = rng.choice(sorted(NODES))
    count = rng.randint(1, NODES[node])
    limits: dict[str, str] = {"cpu": str(rng.randint(1, 4)), "memory": "1Gi", "nvidia.com/gpu": str(count)}
    if rng.random() < 0.5:
        limits["nvidia.com/gpumem"] = str(rng.choice((4096, 8192)))
        limits["nvidia.com/gpucores"] = str(rng.choice((20, 50)))
    annotations = {}
    kind = rng.random()
    if kind < 0.7:  # a record; some share a nonce (a copied record), some carry none
        record = {
            "version": 1, "node": node, "gpus": sorted(rng.sample(range(NODES[node]), count)), "gpuCount": count,
            "memoryMiB": int(limits.get("nvidia.com/gpumem", 0)), "cores": int(limits.get("nvidia.com/gpucores", 100)),
            "vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "topology": "single", "policy": "binpack",
        }
        if rng.random() < 0.8:
            record["nonce"] = f"n-{rng.randint(0, 6)}"
        annotations["gpu-admission.io/allocation"] = json.dumps(record)
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}
    if kind >= 0.7 or rng.random() < 0.5:  # bound (no record: the pod's own nodeName places it)
        spec["nodeName"] = node
    return pod_object(name, annotations, spec)


def host_pod(rng: random.Random, name: str) -> dict[str, Any]:
    limits = {"cpu": str(rng.randint(1, 4)), "memory": "2Gi"}
    spec = {"containers": [{"name": "main", "image": "web", "resources": {"limits": limits}}],
            "nodeName": rng.choice(sorted(NODES))}
    return pod_object(name, {}, spec)


def pod_object(name: str, annotations: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "annotations": annotations}
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": {"phase": "Running"}}


@pytest.mark.parametrize("seed", range(20))
def test_added_usage_equals_the_whole_sum(seed: int) -> None:
    rng = random.Random(seed)
    cache = ClusterCache(clock=lambda: 1000.0)
    base = listed("nodes", "Node") + listed("gpuinventories", "GPUInventory") + listed("namespaces", "Namespace")
    for kind, item_kind in (("nodes", "Node"), ("gpuinventories", "GPUInventory"), ("namespaces", "Namespace")):
        cache.replace(kind, listed(kind, item_kind))
    cache.replace("pods", [])
    live: dict[str, dict[str, Any]] = {}
    for step in range(90):
        roll = rng.random()
        if live and roll < 0.2:
            name = rng.choice(sorted(live))
            cache.apply("pods", "DELETED", live.pop(name))
        elif live and roll < 0.3:  # the same pod changed: a modification keeps its place in the sum
            name = rng.choice(sorted(live))
            live[name] = gpu_pod(rng, name)
            cache.apply("pods", "MODIFIED", live[name])
        else:
            name = f"p{step:03d}"  # names sort as they arrive: the order both sums place loose pods in
            live[name] = gpu_pod(rng, name) if rng.random() < 0.8 else host_pod(rng, name)
            cache.apply("pods", "ADDED", live[name])
        expected = build_snapshot(base + list(live.values())).usage
        assert cache.snapshot().usage == expected, f"seed {seed}, step {step}"


def test_a_job_launch_adds_each_pod_on_without_summing_its_node_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods admitted one after another, each with its own record, are added on: a launch of n pods onto one
    node costs n additions, not n sums over everything already there."""
    import webhook.cluster.cache_usage as cache_module

    sums: list[str] = []
    real = cache_module.node_usage
    monkeypatch.setattr(cache_module, "node_usage", lambda node, pods: sums.append(node.name) or real(node, pods))
    cache = ClusterCache(clock=lambda: 1000.0)
    base = listed("nodes", "Node") + listed("gpuinventories", "GPUInventory") + listed("namespaces", "Namespace")
    for kind, item_kind in (("nodes", "Node"), ("gpuinventories", "GPUInventory"), ("namespaces", "Namespace")):
        cache.replace(kind, listed(kind, item_kind))
    cache.replace("pods", [])
    before = len(sums)
    pods = []
    for i in range(50):
        record = {"version": 1, "node": "gpu-a", "gpus": [i % 4], "gpuCount": 1, "memoryMiB": 1024, "cores": 10,
                  "vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "nonce": f"n-{i}"}
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "10"}
        spec = {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}
        pods.append(pod_object(f"p{i:03d}", {"gpu-admission.io/allocation": json.dumps(record)}, spec))
        cache.apply("pods", "ADDED", pods[-1])
    assert len(sums) == before
    assert cache.snapshot().usage == build_snapshot(base + pods).usage
    # A copied record makes the node's sum depend on more than the newest pod: summed anew.
    copy = pod_object("q000", {"gpu-admission.io/allocation": pods[0]["metadata"]["annotations"][
        "gpu-admission.io/allocation"]}, pods[0]["spec"])
    cache.apply("pods", "ADDED", copy)
    assert sums[before:] == ["gpu-a"]
    assert cache.snapshot().usage == build_snapshot(base + pods + [copy]).usage
