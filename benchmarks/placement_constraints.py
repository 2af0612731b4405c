"""Decision time of `place()` for pods with their own node constraints, against the same pods without.

    python benchmarks/placement_constraints.py                  # 10k and 100k GPUs, binpack
    python benchmarks/placement_constraints.py --sizes 10000 --policy fragmentation

The cluster of benchmarks/placement.py (about half of the GPUs in use), with labels a real cluster
has: a zone (4), a pool (2), a unique hostname label per node, and a NoSchedule taint on one node in
ten. Node constraints are not part of a node shape, so a nodeSelector splits shapes; each set of
constraints is resolved once per node set from the label index and memoised. "hostname" names a
different node on every decision (no memo hit: the worst case). The last column is a check of every
node against the constraints, what a decision would cost on top if constraints were not indexed.
Target: the constraint rows within 2x of "none" and far below the per-node check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_clusters import busy_usage, mixed_cluster  # noqa: E402
from placement import STREAM, WARM_UP, p99  # noqa: E402

from webhook.core.domain.model import Node, Taint  # noqa: E402
from webhook.core.placement.context import PlacementContext  # noqa: E402
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import commit, constraints_for, place

TAINT = Taint("dedicated", "infer", "NoSchedule")


def labelled(nodes: dict[str, Node]) -> dict[str, Node]:
    out = {}
    for i, (name, node) in enumerate(sorted(nodes.items())):
        labels = {**node.labels, "zone": f"z{i % 4}", "pool": "a" if i % 3 else "b", "kubernetes.io/hostname": name}
        out[name] = replace(node, labels=labels, taints=(TAINT,) if i % 10 == 0 else ())
    return out


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def spec_of(variant: str, i: int, names: list[str]) -> dict[str, Any]:
    if variant == "nodeSelector":
        return {"nodeSelector": {"zone": "z1"}}
    if variant == "affinity":
        return {"affinity": affinity({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z0"]},
                                                           {"key": "pool", "operator": "In", "values": ["a"]}]})}
    if variant == "tolerate+prefer":
        preferred = [{"weight": 50, "preference": {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["z2"]}]}}]
        return {"tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}}
    if variant == "hostname":
        return {"nodeSelector": {"kubernetes.io/hostname": names[(i * 7919) % len(names)]}}
    return {}


def timings(gpus: int, policy: str, variant: str, decisions: int) -> tuple[list[float], list[float]]:
    nodes = mixed_cluster(gpus)
    if variant != "plain":
        nodes = labelled(nodes)
    index = NodeIndex.build(nodes, busy_usage(nodes, 0.5))
    names = sorted(nodes)
    ctx = PlacementContext(policy=policy, seed=1)
    spent: list[float] = []
    checks: list[float] = []
    for i in range(-WARM_UP, decisions):
        req = STREAM[i % len(STREAM)]
        req = req.evolve(raw={"spec": spec_of(variant, i, names)})
        started = time.perf_counter()
        found = place(req, index, ctx)
        if i >= 0:
            spent.append(time.perf_counter() - started)
        if i >= 0 and i % 10 == 0:  # the per-node check, timed on a sample of decisions
            started = time.perf_counter()
            constraints = constraints_for(req)
            sum(1 for node in nodes.values() if not constraints.refusal(node))
            checks.append(time.perf_counter() - started)
        best = found.best
        if best is not None:
            index = index.updated({best.node: commit(index.usage(best.node), best, req, nodes[best.node])})
    return spent, checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--decisions", type=int, default=400)
    parser.add_argument("--policy", default="binpack")
    args = parser.parse_args()
    variants = ["plain", "none", "nodeSelector", "affinity", "tolerate+prefer", "hostname"]
    print(f"{'constraints':<17}{'GPUs':>8}{'median ms':>11}{'p99 ms':>9}{'per-node check ms':>19}")
    for size in (int(s) for s in args.sizes.split(",")):
        for variant in variants:
            spent, checks = timings(size, args.policy, variant, args.decisions)
            print(f"{variant:<17}{size:>8}{statistics.median(spent) * 1e3:>11.3f}{p99(spent) * 1e3:>9.3f}"
                  f"{statistics.median(checks) * 1e3:>19.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
