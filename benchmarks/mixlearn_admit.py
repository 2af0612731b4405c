"""What learning the workload mix costs an admission: /mutate's core call on a 1k-node, 10k-pod snapshot.

Builds 1,000 nodes of 8 GPUs with 10,000 running GPU pods of trace-like shapes (whole cards, slices,
multi-GPU; seeded), then times `admit.mutate` of pending pods under the fragmentation policy with
`workloadMix: learn` (the default) beside `workloadMix: default` (no learning) in the same run, CPU time,
best of 5 passes. Also times deriving the mix once per published histogram (what a watch event costs).

    python benchmarks/mixlearn_admit.py [--nodes 1000] [--pods 10000] [--repeat 300]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE = (  # (GPUs, share %, weight): a mix like the Alibaba trace's; each comes with several CPU sizes
    (1, 100, 40), (1, 81, 12), (1, 47, 8), (1, 32, 4), (1, 65, 3), (2, 100, 2), (4, 100, 1), (8, 100, 1),
)
# (GPUs, share %, CPU cores, memory GiB, weight): about 50 distinct request shapes, as in the trace
SHAPES = tuple((g, share, cpu * g, cpu * 4 * g, w) for g, share, w in BASE for cpu in (2, 4, 6, 8, 12, 16))


def node(name: str) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
              "nvidia.com/gpu.count": "8"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "8"}}}


def pod(name: str, shape: tuple[int, int, int, int, int], node_name: str | None) -> dict[str, Any]:
    gpus, share, cpu, memory, _ = shape
    limits = {"nvidia.com/gpu": str(gpus)}
    if share < 100:
        limits.update({"nvidia.com/gpucores": str(share), "nvidia.com/gpumem-percentage": str(share)})
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "resources": {
        "limits": limits, "requests": {"cpu": str(cpu), "memory": f"{memory}Gi"}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team", "uid": name},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


def objects(nodes: int, pods: int, seed: int = 7) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    weights = [s[4] for s in SHAPES]
    found: list[dict[str, Any]] = [node(f"n{i}") for i in range(nodes)]
    found.append({"apiVersion": "v1", "kind": "Namespace",
                  "metadata": {"name": "team", "labels": {"gpu-admission.io/enabled": "true"}}})
    # Running pods spread so that no node is over-committed: GPUs handed out node by node.
    free = {f"n{i}": 8 for i in range(nodes)}
    names = list(free)
    for i in range(pods):
        shape = rng.choices(SHAPES, weights)[0]
        host = names[i % len(names)]
        if free[host] >= shape[0]:
            free[host] -= shape[0]
            found.append(pod(f"p{i}", shape, host))
    pending = [pod(f"new{i}", rng.choices(SHAPES, weights)[0], None) for i in range(64)]
    return found, pending


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()

    from webhook.cluster.translate import build_snapshot
    from webhook.core.admission import admit
    from webhook.core.policy.model import parse_policy

    cluster, pending = objects(args.nodes, args.pods)
    snapshot = build_snapshot(cluster)
    held = sum(1 for o in cluster if o["kind"] == "Pod")
    print(f"{len(snapshot.nodes)} nodes, {held} running GPU pods, mutate of {len(pending)} pending pods")
    policies = {name: parse_policy({"defaults": {"placement": "fragmentation"}, **extra})
                for name, extra in (("learn", {}), ("default", {"workloadMix": "default"}))}
    results: dict[str, float] = {}
    for name, policy in policies.items():
        for p in pending:  # warm: the placement index and the per-state memos
            admit.mutate(p, snapshot, policy, namespace="team")
        best = float("inf")
        for _ in range(5):
            started = time.process_time()
            for i in range(args.repeat):
                admit.mutate(pending[i % len(pending)], snapshot, policy, namespace="team")
            best = min(best, (time.process_time() - started) / args.repeat)
        results[name] = best * 1e6
        print(f"workloadMix: {name:8} {results[name]:8.1f} us per mutate")
    print(f"learn / default: {results['learn'] / results['default']:.3f}")
    try:
        from webhook.core.placement.mixlearn import hosts_of, mix_of
    except ImportError:
        return
    assert snapshot.observed is not None
    hosts = hosts_of(snapshot.nodes.values())
    started = time.process_time()
    for _ in range(100):
        mix_of(dict(snapshot.observed.counts), hosts)
    print(f"deriving the mix from the histogram ({len(snapshot.observed.counts)} shapes): "
          f"{(time.process_time() - started) / 100 * 1e6:.0f} us, once per published histogram")


if __name__ == "__main__":
    main()
