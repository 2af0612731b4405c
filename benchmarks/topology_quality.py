"""Topology quality of placement: do multi-GPU pods get all-NVLink GPU sets whenever one exists?

    python benchmarks/topology_quality.py
    python benchmarks/topology_quality.py --nvswitch 2 --paired 2 --pcie 2 --pods 600 --seeds 1-5

A cluster of NVSwitch 8-GPU nodes, 8-GPU nodes with NVLink bridges in pairs and PCIe-only nodes takes
a stream of 2-, 4- and 8-GPU pods mixed with single-card and shared pods; pods also leave, so the
cluster stays busy and fragmented. For every multi-GPU pod placed, the benchmark searches the cluster
as it is at that moment exhaustively (every node, every free GPU subset of the size) for the best
achievable topology class and its expected loss. Reported per policy:
- NVLink share: multi-GPU pods placed on an all-NVLink set, among those for which one existed;
- mean expected communication loss of the multi-GPU pods against the exhaustive optimum (gap in %);
for this product's policies (topology preferred, the default) and for topology-blind baselines (the
same node policy, GPUs taken first-fit, as a device plugin without topology awareness does).
Target: 100 % of the achievable all-NVLink placements and loss within 1 % of the optimum.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_clusters import nvswitch_node, paired_node, pcie_node  # noqa: E402

from webhook.core.domain.model import Node, NodeUsage, Option, TopologyClass
from webhook.core.domain.request import PodRequest, TopologyPreference
from webhook.core.placement.context import DEFAULT_LOSS, PlacementContext
from webhook.core.placement.nodeindex import (
    NodeIndex,  # noqa: E402
    normalised,  # noqa: E402
)
from webhook.core.placement.place import commit, place
from webhook.core.placement.topology import classify_pairs  # noqa: E402

PRODUCT = ("binpack", "spread", "fragmentation", "fewest-tasks", "best-fit", "dot-product", "random")
BLIND = ("binpack", "spread", "random")
RANK = {TopologyClass.SINGLE: 0, TopologyClass.NVLINK: 0, TopologyClass.MIXED: 1, TopologyClass.PCIE: 2}


def pod(gpus: int, topology: TopologyPreference | None = None, **kwargs: object) -> PodRequest:
    return PodRequest("bench", "pod", vendor="nvidia", gpus=gpus, is_gpu_pod=True, topology=topology, **kwargs)  # type: ignore[arg-type]


# (weight, request): single cards and slices dominate in count; multi-GPU pods bring most of the GPUs.
MIX = [
    (30, pod(1, cpu_milli=4000)),
    (15, pod(1, memory_pct=25, cores=25, cpu_milli=1000)),
    (10, pod(1, memory_pct=50, cores=50, cpu_milli=2000)),
    (20, pod(2, cpu_milli=8000)),
    (15, pod(4, cpu_milli=16000)),
    (10, pod(8, cpu_milli=32000)),
]


def build_cluster(nvswitch: int, paired: int, pcie: int) -> dict[str, Node]:
    nodes = [nvswitch_node(f"nvswitch-{i}") for i in range(nvswitch)]
    nodes += [paired_node(f"paired-{i}") for i in range(paired)]
    nodes += [pcie_node(f"pcie-{i}", 8) for i in range(pcie)]
    return {n.name: n for n in nodes}


def stream(count: int, seed: int) -> list[tuple[PodRequest, int]]:
    """Pods in arrival order, each with how many arrivals it stays for."""
    rng = random.Random(seed)
    weights = [w for w, _ in MIX]
    return [(rng.choices([r for _, r in MIX], weights)[0], rng.randint(3, 25)) for _ in range(count)]


def free_gpus(node: Node, used: NodeUsage, req: PodRequest) -> list[int]:
    """GPUs of the node a whole-card pod could take now."""
    return [i for i, (g, u) in enumerate(zip(node.gpus, used.gpus, strict=True)) if g.healthy and u.tasks == 0]


def optimum(nodes: dict[str, Node], usage: dict[str, NodeUsage], req: PodRequest) -> TopologyClass | None:
    """Best topology class any node could give the pod now, by exhaustive search over GPU subsets."""
    best: TopologyClass | None = None
    for name, node in nodes.items():
        used = usage[name]
        if node.cpu_milli - used.cpu_milli < req.cpu_milli:
            continue
        for combo in combinations(free_gpus(node, used, req), req.gpus):
            pairs = sum(1 for a, b in combinations(combo, 2) if node.nvlink[a][b] > 0)
            found = classify_pairs(req.gpus, pairs)
            if best is None or RANK[found] < RANK[best]:
                best = found
            if best is TopologyClass.NVLINK:
                return best
    return best


@dataclass
class Outcome:
    multi: int = 0  # multi-GPU pods placed
    achievable: int = 0  # ... for which an all-NVLink set existed
    nvlink: int = 0  # ... placed on one
    loss: float = 0.0  # summed expected loss of the multi-GPU pods placed
    optimum: float = 0.0  # summed optimum loss for the same pods
    failed: int = 0  # pods no node could host

    @property
    def share(self) -> float:
        return self.nvlink / self.achievable if self.achievable else 1.0

    @property
    def gap(self) -> float:
        return (self.loss - self.optimum) / self.optimum if self.optimum else 0.0

    def add(self, other: Outcome) -> None:
        for name in ("multi", "achievable", "nvlink", "loss", "optimum", "failed"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def run(nodes: dict[str, Node], pods: Iterable[tuple[PodRequest, int]], policy: str, blind: bool) -> Outcome:
    """Place the stream with one policy; pods leave after their stay."""
    index = NodeIndex.build(nodes, {})
    usage = {name: index.usage(name) for name in nodes}
    running: dict[str, list[tuple[Option, PodRequest]]] = {name: [] for name in nodes}
    leaving: dict[int, list[tuple[str, Option, PodRequest]]] = {}
    ctx = PlacementContext(policy=policy, seed=3)
    out = Outcome()
    for step, (req, stay) in enumerate(pods):
        for name, option, gone in leaving.pop(step, []):
            running[name].remove((option, gone))
            rebuilt = normalised(nodes[name], None)
            for kept, kept_req in running[name]:
                rebuilt = commit(rebuilt, kept, kept_req, nodes[name])
            usage[name] = rebuilt
            index.apply(name, rebuilt)
        asked = replace(req, topology=TopologyPreference.NONE) if blind else req
        best_now = optimum(nodes, usage, req) if req.gpus > 1 else None
        found = place(asked, index, replace(ctx, seed=step)).best
        if found is None:
            out.failed += 1
            continue
        if req.gpus > 1:
            assert best_now is not None
            out.multi += 1
            out.achievable += best_now is TopologyClass.NVLINK
            out.nvlink += best_now is TopologyClass.NVLINK and found.topology is TopologyClass.NVLINK
            out.loss += DEFAULT_LOSS[found.topology]
            out.optimum += DEFAULT_LOSS[best_now]
        usage[found.node] = commit(usage[found.node], found, req, nodes[found.node])
        index.apply(found.node, usage[found.node])
        running[found.node].append((found, req))
        leaving.setdefault(step + stay, []).append((found.node, found, req))
    return out


def evaluate(nodes: dict[str, Node], pods: int, seeds: Iterable[int]) -> dict[str, Outcome]:
    results: dict[str, Outcome] = {}
    for seed in seeds:
        arrivals = stream(pods, seed)
        for blind, policies in ((False, PRODUCT), (True, BLIND)):
            for policy in policies:
                label = f"{policy} (topology-blind)" if blind else policy
                results.setdefault(label, Outcome()).add(run(nodes, arrivals, policy, blind))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvswitch", type=int, default=2, help="NVSwitch 8-GPU nodes")
    parser.add_argument("--paired", type=int, default=2, help="8-GPU nodes with NVLink bridges in pairs")
    parser.add_argument("--pcie", type=int, default=2, help="PCIe-only 8-GPU nodes")
    parser.add_argument("--pods", type=int, default=500, help="pods per stream")
    parser.add_argument("--seeds", default="1-5", help="stream seeds, as FIRST-LAST")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    nodes = build_cluster(args.nvswitch, args.paired, args.pcie)
    results = evaluate(nodes, args.pods, range(int(first), int(last or first) + 1))
    gpus = sum(len(n.gpus) for n in nodes.values())
    print(f"{len(nodes)} nodes, {gpus} GPUs; {args.pods} pods per seed, seeds {args.seeds}")
    header = f"{'policy':<30}{'multi-GPU':>10}{'NVLink possible':>16}{'got NVLink':>11}{'share':>8}"
    print(header + f"{'mean loss':>10}{'optimum':>9}{'gap':>8}{'failed':>8}")
    for label, o in results.items():
        mean = o.loss / o.multi if o.multi else 0.0
        best = o.optimum / o.multi if o.multi else 0.0
        print(
            f"{label:<30}{o.multi:>10}{o.achievable:>16}{o.nvlink:>11}{o.share:>8.1%}"
            f"{mean:>10.4f}{best:>9.4f}{o.gap:>8.2%}{o.failed:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
