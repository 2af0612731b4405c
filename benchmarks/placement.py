"""Decision time of `place()` per policy as the cluster grows, against a linear scan over every node.

    python benchmarks/placement.py                 # 1k, 10k and 100k GPUs
    python benchmarks/placement.py --sizes 1000,10000 --decisions 300

The cluster mixes NVSwitch H100, NVLink-paired A100 and PCIe-only L4/A10 nodes with about half of the
GPUs in use (whole-card and shared pods, see gpu_clusters.busy_usage). Each decision is followed by its
commit through `NodeIndex.updated()`, as the webhook does after admitting a pod, so the cluster changes
under the measurement. The baseline is a plain scan that checks and scores every node for a pod (binpack,
first-fit GPUs, no topology search): what placement costs without the index of equivalent nodes.
Targets: median <= 1 ms at 10k GPUs for binpack and spread, <= 5 ms for fragmentation, growing less
than linearly with the cluster.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_clusters import busy_usage, mixed_cluster  # noqa: E402

from webhook.core.domain.model import Node, NodeUsage
from webhook.core.domain.request import PodRequest, TopologyPreference
from webhook.core.placement.context import POLICIES, PlacementContext
from webhook.core.placement.nodeindex import NodeIndex  # noqa: E402
from webhook.core.placement.place import commit, place

WARM_UP = 16  # decisions not timed: the first sight of each pod shape (memoised afterwards)


def pod(gpus: int, **kwargs: object) -> PodRequest:
    return PodRequest("bench", "pod", vendor="nvidia", gpus=gpus, is_gpu_pod=True, **kwargs)  # type: ignore[arg-type]


# What arrives: mostly single cards and slices, some multi-GPU training pods.
STREAM = [
    pod(1, cpu_milli=8000, memory_mib_host=65536),
    pod(1, memory_pct=25, cores=25, cpu_milli=2000, memory_mib_host=16384),
    pod(1, memory_mib=10240, cores=50, cpu_milli=4000, memory_mib_host=32768),
    pod(2, cpu_milli=16000, memory_mib_host=131072),
    pod(1, memory_pct=50, cores=50, cpu_milli=4000, memory_mib_host=32768),
    pod(4, cpu_milli=32000, memory_mib_host=262144),
    pod(1, cpu_milli=8000, memory_mib_host=65536, models_include=("h100",)),
    pod(8, cpu_milli=64000, memory_mib_host=524288, topology=TopologyPreference.REQUIRED),
]


def naive_binpack(req: PodRequest, nodes: dict[str, Node], usage: dict[str, NodeUsage], limit: int = 5) -> list[str]:
    """Linear scan: every node's GPUs checked and scored on every decision."""
    scored: list[tuple[float, str]] = []
    for name, node in nodes.items():
        used = usage.get(name)
        if req.vendor != node.vendor or len(node.gpus) < req.gpus:
            continue
        if req.models_include and not any(m in node.gpu_model.lower() for m in req.models_include):
            continue
        cpu = used.cpu_milli if used else 0
        memory = used.memory_mib if used else 0
        if cpu + req.cpu_milli > node.cpu_milli or memory + req.memory_mib_host > node.memory_mib:
            continue
        fitting = 0
        units = 0.0
        for i, gpu in enumerate(node.gpus):
            u = used.gpus[i] if used and used.gpus else None
            share = max(u.memory_mib / gpu.memory_mib, u.cores / 100) if u else 0.0
            units += 1.0 if u and u.exclusive else share
            need_memory = req.memory_mib or gpu.memory_mib * (req.memory_pct or 100) // 100
            need_cores = req.cores or 100
            if not gpu.healthy or (u and u.exclusive):
                continue
            if not req.shared and u and (u.tasks or u.memory_mib):
                continue
            if u and (u.memory_mib + need_memory > gpu.memory_mib or u.cores + need_cores > 100):
                continue
            fitting += 1
        if fitting >= req.gpus:
            scored.append((-units / len(node.gpus), name))
    return [name for _, name in heapq.nsmallest(limit, scored)]


def timings(gpus: int, policy: str, decisions: int) -> tuple[list[float], int, float]:
    nodes = mixed_cluster(gpus)
    usage = busy_usage(nodes, 0.5)
    started = time.perf_counter()
    index = NodeIndex.build(nodes, usage)
    build = time.perf_counter() - started
    ctx = PlacementContext(policy=policy, seed=1)
    spent: list[float] = []
    for i in range(-WARM_UP, decisions):
        req = STREAM[i % len(STREAM)]
        started = time.perf_counter()
        found = place(req, index, ctx)
        if i >= 0:
            spent.append(time.perf_counter() - started)
        best = found.best
        if best is not None:
            after = commit(index.usage(best.node), best, req, nodes[best.node])
            index = index.updated({best.node: after})
    return spent, index.class_count(), build


def naive_timings(gpus: int, decisions: int) -> list[float]:
    nodes = mixed_cluster(gpus)
    usage = busy_usage(nodes, 0.5)
    spent = []
    for i in range(decisions):
        started = time.perf_counter()
        naive_binpack(STREAM[i % len(STREAM)], nodes, usage)
        spent.append(time.perf_counter() - started)
    return spent


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000", help="cluster sizes in GPUs, comma-separated")
    parser.add_argument("--decisions", type=int, default=400, help="decisions timed per policy and size")
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    policies = args.policies.split(",")
    medians: dict[tuple[str, int], float] = {}
    print(f"{'policy':<14}{'GPUs':>8}{'nodes':>7}{'classes':>9}{'median ms':>11}{'p99 ms':>9}{'vs scan':>9}")
    for size in sizes:
        scan = naive_timings(size, max(40, args.decisions // 10))
        medians[("scan", size)] = statistics.median(scan)
        nodes = len(mixed_cluster(size))
        for policy in policies:
            spent, classes, build = timings(size, policy, args.decisions)
            medians[(policy, size)] = statistics.median(spent)
            ratio = medians[("scan", size)] / medians[(policy, size)]
            print(
                f"{policy:<14}{size:>8}{nodes:>7}{classes:>9}{medians[(policy, size)] * 1e3:>11.3f}"
                f"{p99(spent) * 1e3:>9.3f}{ratio:>8.1f}x"
            )
        print(
            f"{'linear scan':<14}{size:>8}{nodes:>7}{'-':>9}{medians[('scan', size)] * 1e3:>11.3f}"
            f"{p99(scan) * 1e3:>9.3f}{'1.0':>8}x   (index build {build * 1e3:.0f} ms)"
        )
    if len(sizes) > 1:
        print("\ngrowth of the median per 10x GPUs (1.0 = constant, 10 = linear):")
        for policy in [*policies, "scan"]:
            steps = [
                f"{sizes[i]}->{sizes[i + 1]}: {medians[(policy, sizes[i + 1])] / medians[(policy, sizes[i])]:.2f}"
                for i in range(len(sizes) - 1)
            ]
            print(f"  {policy:<14}" + "  ".join(steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
