"""Watch cache at scale: memory held for 10,000 nodes and 100,000 pods, and the cost of `snapshot()`.

    python benchmarks/cache.py [--nodes 10000] [--pods 100000] [--samples 2000]

Targets: RSS under 500 MiB with the whole cluster loaded; `snapshot()` under 5 ms after a change.
The baseline, measured in the same run, is what a cache without incremental upkeep would pay per
admission: `translate.build_snapshot` over every object, from scratch.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from webhook.cluster.cache import ClusterCache  # noqa: E402
from webhook.cluster.source import LiveSource  # noqa: E402
from webhook.cluster.translate import build_snapshot  # noqa: E402
from webhook.core.domain.decision import Decision  # noqa: E402
from webhook.core.domain.model import Allocation, TopologyClass
from webhook.core.placement.state import index_of  # noqa: E402

MODEL, CARD = "NVIDIA-H100-80GB-HBM3", 81559
NAMESPACES = 100
MANAGED = [
    {
        "manager": "kubelet",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-12-01T08:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:conditions": {".": {}}}},
    }
]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def node(i: int) -> dict[str, Any]:
    name = f"node-{i:05d}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "topology.kubernetes.io/zone": f"z{i % 3}",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": MODEL,
        "nvidia.com/gpu.memory": str(CARD),
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.sharing-strategy": "none",
    }
    alloc = {"cpu": "224", "memory": "2014Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": str(i),
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": MANAGED,
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24"},
        "status": {
            "capacity": dict(alloc),
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": [
                {"names": [f"nvcr.io/nvidia/pytorch:24.{k:02d}-py3"], "sizeBytes": 9 * 2**30} for k in range(10)
            ],
        },
    }


def inventory(i: int) -> dict[str, Any]:
    name = f"node-{i:05d}"
    gpus = [
        {"index": g, "uuid": f"GPU-{i:05d}-{g}", "model": MODEL, "memoryMiB": CARD, "numa": g // 4, "healthy": True}
        for g in range(8)
    ]
    return {
        "kind": "GPUInventory",
        "apiVersion": "gpu-admission.io/v1alpha1",
        "metadata": {"name": name},
        "spec": {
            "version": 1,
            "gpus": gpus,
            "nvlink": [[0 if a == b else 18 for b in range(8)] for a in range(8)],
            "pcie": [["X" if a == b else ("NODE" if a // 4 == b // 4 else "SYS") for b in range(8)] for a in range(8)],
        },
    }


def pod(i: int, nodes: int) -> dict[str, Any]:
    """Ten pods per node: three whole H100s, two 25 % slices of GPU 3, five CPU-only pods."""
    node_name = f"node-{i // 10 % nodes:05d}"
    slot = i % 10
    limits: dict[str, str] = {"cpu": "4", "memory": "16Gi"}
    annotations: dict[str, str] = {}
    if slot < 5:
        shared = slot >= 3
        limits["nvidia.com/gpu"] = "1"
        if shared:
            limits.update({"nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "25"})
        allocation = {
            "version": 1,
            "node": node_name,
            "gpus": [3 if shared else slot],
            "uuids": [],
            "gpuCount": 1,
            "memoryMiB": 20000 if shared else CARD,
            "cores": 25 if shared else 100,
            "vendor": "nvidia",
            "model": MODEL,
            "topology": "single",
            "loss": 0.0,
            "policy": "binpack",
        }
        annotations["gpu-admission.io/allocation"] = json.dumps(allocation, separators=(",", ":"))
    name = f"pod-{i:06d}"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": f"ns-{i % NAMESPACES:03d}",
            "uid": f"uid-{name}",
            "resourceVersion": str(100000 + i),
            "labels": {"app": name[:-2]},
            "annotations": annotations,
            "managedFields": MANAGED,
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {"limits": limits, "requests": dict(limits)},
                }
            ],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def namespaces() -> Iterator[dict[str, Any]]:
    for n in range(NAMESPACES):
        yield {"kind": "Namespace", "metadata": {"name": f"ns-{n:03d}", "labels": {"gpu-admission.io/enabled": "true"}}}


def quotas() -> Iterator[dict[str, Any]]:
    for n in range(NAMESPACES):
        yield {
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": f"ns-{n:03d}"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "1000"}},
        }


def timed(call: Any, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1000)
    return out


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    return f"median {statistics.median(ms):.3f} ms, p99 {ms[int(len(ms) * 0.99) - 1]:.3f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--baseline-runs", type=int, default=2)
    args = parser.parse_args()

    gc.collect()
    start_rss = rss_mib()
    cache = ClusterCache()
    started = time.perf_counter()
    cache.replace("nodes", (node(i) for i in range(args.nodes)))
    cache.replace("gpuinventories", (inventory(i) for i in range(args.nodes)))
    cache.replace("namespaces", namespaces())
    cache.replace("resourcequotas", quotas())
    cache.replace("pods", (pod(i, args.nodes) for i in range(args.pods)))
    load_s = time.perf_counter() - started
    snap = cache.snapshot()
    started = time.perf_counter()
    index_of(snap)
    index_s = time.perf_counter() - started
    gc.collect()
    gc.freeze()  # as the webhook's upkeep thread does once synced: the loaded cluster leaves the GC's scans
    loaded_rss = rss_mib()
    print(
        f"cluster: {args.nodes} nodes (8 x H100 each, GPUInventory), {args.pods} pods "
        f"({args.pods // 2} on GPUs), {NAMESPACES} namespaces with quotas"
    )
    print(f"load (list of every kind, translated): {load_s:.1f} s; placement index build: {index_s * 1000:.0f} ms")
    print(
        f"RSS: {loaded_rss:.0f} MiB with the cache loaded ({loaded_rss - start_rss:.0f} MiB for the cache; "
        f"interpreter and imports {start_rss:.0f} MiB), peak {peak_mib():.0f} MiB   target < 500 MiB"
    )

    unchanged = timed(cache.snapshot, args.samples)
    print(f"snapshot(), nothing changed:        {summary(unchanged)}")

    # One pod event between admissions: a GPU pod starts or ends (usage of one node, one namespace).
    churn = [pod(args.pods + k, args.nodes) for k in range(args.samples)]
    after_pod: list[float] = []
    for k in range(len(churn)):
        cache.apply("pods", "ADDED" if k % 2 == 0 else "DELETED", churn[k - k % 2])
        started = time.perf_counter()
        snap = cache.snapshot()
        after_pod.append((time.perf_counter() - started) * 1000)
        assert snap.derived.index is not None  # the placement index followed, copy-on-write
    print(f"snapshot() after one pod event:     {summary(after_pod)}   target < 5 ms")

    # A node event (label change): nodes change, the index is rebuilt lazily by the first placement.
    after_node: list[float] = []
    for k in range(min(50, args.samples)):
        changed = node(k)
        changed["metadata"]["labels"]["example.com/rack"] = f"r{k}"
        cache.apply("nodes", "MODIFIED", changed)
        started = time.perf_counter()
        cache.snapshot()
        after_node.append((time.perf_counter() - started) * 1000)
    print(f"snapshot() after one node event:    {summary(after_node)} (placement index rebuilt on first use)")

    # Admissions recording reservations: commit() (decide + record, in-process store) then snapshot().
    source = LiveSource(cache)
    for kind in ("nodes", "gpuinventories", "namespaces", "resourcequotas", "pods"):
        cache.heard(kind)
    index_of(cache.snapshot())
    admit = Decision(
        True,
        allocation=Allocation("node-00042", (7,), 1, 20000, 25, "nvidia", MODEL, TopologyClass.SINGLE, 0.0, "binpack"),
    )
    commits = timed(
        lambda: source.commit(f"uid-new-{time.perf_counter_ns()}", "ns-001", lambda s: admit, False),
        min(200, args.samples),
    )
    views = timed(source.snapshot, 1)
    print(
        f"commit() with up to {len(commits)} reservations in flight: {summary(commits)}; "
        f"snapshot() with them all: {views[0]:.3f} ms"
    )

    del churn
    gc.collect()
    objects: list[dict[str, Any]] = [node(i) for i in range(args.nodes)]
    objects += [inventory(i) for i in range(args.nodes)]
    objects += list(namespaces()) + list(quotas())
    objects += [pod(i, args.nodes) for i in range(args.pods)]
    baseline = timed(lambda: build_snapshot(objects), args.baseline_runs)
    base_ms = statistics.median(baseline)
    print(f"baseline build_snapshot() from scratch: median {base_ms:.0f} ms over {args.baseline_runs} runs")
    print(f"ratio baseline / snapshot() after a pod event: {base_ms / statistics.median(after_pod):,.0f}x")
    ok = loaded_rss < 500 and statistics.median(after_pod) < 5
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
