"""Multi-pod groups on NVLink domains: are jobs kept inside one domain, and what does it cost per pod?

    python benchmarks/group_topology.py
    python benchmarks/group_topology.py --gpus 10000 --jobs 1500 --seed 1

A generated cluster of GB200 NVL72-like cliques (18 nodes x 4 GPUs sharing one `nvidia.com/gpu.clique`,
72 GPUs per domain), four cliques per `topology.kubernetes.io/rack`, plus PCIe-only 8-GPU nodes in racks
of their own (about 2 % of the GPUs), takes a stream of multi-pod jobs of 2..16 pods x 1, 2, 4 or 8 GPUs
(8-GPU pods fit only the PCIe nodes, whose domain is the rack) that leave after a while, so the cluster
stays 70-90 % busy. Every pod is decided by the real `admit.mutate` (policy defaults: groups `preferred`),
and after each admitted pod its group's record is updated with `core.groups.commit` as the webhook's
ledger does, so later pods follow their group. The same stream is then run with groups ignored (policy
`groupTopology.mode: none`: placement pod by pod, binpack) as the baseline, in the same process.

Reported, for both runs and as ratios:
- kept whole: share of groups with all pods in one domain, among those for which some domain had room
  for the whole group when its first pod arrived (target 100 %);
- stranded: free GPUs in partly used cliques, averaged over the run (a whole free clique can take a big
  job; free GPUs scattered over partly used ones cannot);
- first-pod time: median / p99 CPU time of `admit.mutate` for a group's first pod, the one that chooses
  the domain (target: median under 2 ms at 10k GPUs), and for the later pods.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webhook.core.admission import admit  # noqa: E402
from webhook.core.domain.model import Allocation, Gpu, Namespace, Node, NodeUsage, Snapshot  # noqa: E402
from webhook.core.domain.names import GROUP_ANNOTATION, GROUP_SIZE_ANNOTATION  # noqa: E402
from webhook.core.placement.group_room import domain_free, split_domain  # noqa: E402
from webhook.core.placement.groups import GroupRecord, commit, group_of
from webhook.core.placement.state import add_to_node, index_of, with_allocation, with_usage  # noqa: E402  # noqa: E402
from webhook.core.policy.model import Policy  # noqa: E402

CLIQUE = "nvidia.com/gpu.clique"
RACK = "topology.kubernetes.io/rack"
NAMESPACE = "train"
CLIQUE_NODES, NODE_GPUS = 18, 4  # GB200 NVL72: 18 compute trays of 4 GPUs in one NVLink domain
CLIQUES_PER_RACK = 4
PCIE_GPUS = 8
PODS = range(2, 17)
GPUS_PER_POD = ((1, 20), (2, 25), (4, 50), (8, 5))  # (GPUs, weight)


def _node(name: str, model: str, memory: int, count: int, nvlink: int, labels: dict[str, str]) -> Node:
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", model, memory, 0) for i in range(count))
    links = tuple(tuple(0 if i == j else nvlink for j in range(count)) for i in range(count))
    pcie = tuple(tuple("X" if i == j else "NODE" for j in range(count)) for i in range(count))
    return Node(name, gpus, links, pcie, cpu_milli=144_000, memory_mib=900_000, inventory_source="inventory",
                labels={"nvidia.com/gpu.product": model, **labels})


def build(gpus: int) -> Snapshot:
    """About `gpus` GPUs: NVL72 cliques, and PCIe 8-GPU nodes for about 2 % of them."""
    cliques = max(1, round(gpus * 0.98 / (CLIQUE_NODES * NODE_GPUS)))
    pcie_nodes = max(1, (gpus - cliques * CLIQUE_NODES * NODE_GPUS) // PCIE_GPUS)
    nodes: list[Node] = []
    for c in range(cliques):
        rack = f"rack-{c // CLIQUES_PER_RACK}"
        for n in range(CLIQUE_NODES):
            nodes.append(_node(f"gb-{c}-{n}", "NVIDIA-GB200", 189_471, NODE_GPUS, 18,
                               {CLIQUE: f"nvl72-{c}", RACK: rack}))
    for n in range(pcie_nodes):
        nodes.append(_node(f"pcie-{n}", "NVIDIA-L40S", 46_068, PCIE_GPUS, 0, {RACK: f"pcie-rack-{n // 8}"}))
    return Snapshot(nodes={n.name: n for n in nodes}, usage={n.name: NodeUsage() for n in nodes},
                    namespaces={NAMESPACE: Namespace(NAMESPACE, {"gpu-admission.io/enabled": "true"})})


@dataclass
class Job:
    name: str
    pods: int
    gpus: int
    leaves_at: int  # arrival number after which it leaves


def stream(jobs: int, capacity: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    sizes, weights = zip(*GPUS_PER_POD, strict=True)
    mean = statistics.mean(PODS) * sum(s * w for s, w in GPUS_PER_POD) / sum(weights)
    stay = 0.8 * capacity / mean  # jobs present at once for a cluster about 80 % busy
    out = []
    for i in range(jobs):
        out.append(Job(f"job-{i}", rng.choice(PODS), rng.choices(sizes, weights)[0],
                       i + max(1, int(rng.uniform(0.5, 1.5) * stay))))
    return out


def pod(job: Job, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{job.name}-{index}", "namespace": NAMESPACE,
                     "annotations": {GROUP_ANNOTATION: job.name, GROUP_SIZE_ANNOTATION: str(job.pods)}},
        "spec": {"containers": [{"name": "main", "image": "train",
                                 "resources": {"limits": {"nvidia.com/gpu": str(job.gpus)}}}]},
    }


@dataclass
class Run:
    policy: Policy
    snapshot: Snapshot
    placed: dict[str, list[Allocation]] = field(default_factory=dict)  # job -> its placed pods
    on_node: dict[str, list[Allocation]] = field(default_factory=dict)
    first_ms: list[float] = field(default_factory=list)
    later_ms: list[float] = field(default_factory=list)
    possible: int = 0
    kept: int = 0
    stranded: list[int] = field(default_factory=list)
    waited: int = 0  # pods admitted with no node free now

    def domain_room(self, job: Job) -> bool:
        """Some domain (clique; rack for 8-GPU pods) could take the whole group now."""
        level = RACK if job.gpus > NODE_GPUS else CLIQUE
        room: dict[str, int] = {}
        usage = self.snapshot.usage
        for name, node in self.snapshot.nodes.items():
            value = node.labels.get(level)
            if value is None or len(node.gpus) < job.gpus:
                continue
            free = sum(1 for u in usage[name].gpus if not u.tasks) if usage[name].gpus else len(node.gpus)
            room[value] = room.get(value, 0) + free // job.gpus
        return any(r >= job.pods for r in room.values())

    def arrive(self, job: Job) -> None:
        possible = self.domain_room(job)
        allocations: list[Allocation] = []
        for i in range(job.pods):
            started = time.thread_time()  # CPU time: other work on the machine leaves it alone
            decision = admit.mutate(pod(job, i), self.snapshot, self.policy, namespace=NAMESPACE)
            (self.first_ms if i == 0 else self.later_ms).append((time.thread_time() - started) * 1000)
            allocation = decision.allocation
            if not decision.allowed or allocation is None:
                raise SystemExit(f"{job.name} pod {i}: {decision.reason}: {decision.message}")
            if allocation.node is None:
                self.waited += 1
                continue
            if allocation.domain:  # as the ledger records it between pods: later ones follow
                self.join(job, i, allocation)
            self.snapshot = with_allocation(self.snapshot, NAMESPACE, allocation)
            self.on_node.setdefault(allocation.node, []).append(allocation)
            allocations.append(allocation)
        self.placed[job.name] = allocations
        if possible:
            self.possible += 1
            level = RACK if job.gpus > NODE_GPUS else CLIQUE
            domains = {self.snapshot.nodes[a.node or ""].labels.get(level) for a in allocations}
            self.kept += len(allocations) == job.pods and len(domains) == 1

    def join(self, job: Job, index: int, allocation: Allocation) -> None:
        ref = group_of(pod(job, index), NAMESPACE)
        assert ref is not None
        level, value = split_domain(allocation.domain)
        outcome = commit(self.snapshot.groups, ref, level, value, allocation.gpu_count, f"{job.name}-{index}",
                         free=domain_free(self.snapshot, allocation.domain))
        if isinstance(outcome, GroupRecord):
            self.snapshot = replace(self.snapshot, groups={**self.snapshot.groups, outcome.key: outcome})

    def leave(self, job: Job) -> None:
        gone = self.placed.pop(job.name, [])
        changed: dict[str, NodeUsage] = {}
        for allocation in gone:
            name = allocation.node or ""
            self.on_node[name] = [a for a in self.on_node[name] if a is not allocation]
            usage = NodeUsage()
            for rest in self.on_node[name]:
                usage = add_to_node(self.snapshot.nodes[name], usage, rest)
            changed[name] = usage
        groups: Mapping[str, Any] = {k: r for k, r in self.snapshot.groups.items() if k != f"{NAMESPACE}/{job.name}"}
        index_of(self.snapshot)
        self.snapshot = with_usage(self.snapshot, changed, groups=groups)

    def sample_stranded(self) -> None:
        free: dict[str, list[int]] = {}
        for name, node in self.snapshot.nodes.items():
            clique = node.labels.get(CLIQUE)
            if clique is None:
                continue
            idle = sum(1 for u in self.snapshot.usage[name].gpus if not u.tasks) if self.snapshot.usage[name].gpus \
                else len(node.gpus)
            entry = free.setdefault(clique, [0, 0])
            entry[0] += idle
            entry[1] += len(node.gpus)
        self.stranded.append(sum(idle for idle, total in free.values() if 0 < idle < total))


def run(policy: Policy, snapshot: Snapshot, jobs: list[Job]) -> Run:
    state = Run(policy, snapshot)
    leaving = sorted(jobs, key=lambda j: j.leaves_at)
    gone = 0
    for number, job in enumerate(jobs):
        while gone < len(leaving) and leaving[gone].leaves_at <= number:
            state.leave(leaving[gone])
            gone += 1
        state.arrive(job)
        if number % 10 == 0:
            state.sample_stranded()
    return state


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=1_500)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    snapshot = build(args.gpus)
    capacity = sum(len(n.gpus) for n in snapshot.nodes.values())
    cliques = len({n.labels[CLIQUE] for n in snapshot.nodes.values() if CLIQUE in n.labels})
    jobs = stream(args.jobs, capacity, args.seed)
    print(f"{capacity} GPUs: {cliques} NVL72 cliques ({cliques * CLIQUE_NODES * NODE_GPUS} GPUs), "
          f"{capacity - cliques * CLIQUE_NODES * NODE_GPUS} on PCIe nodes; {len(jobs)} jobs, "
          f"{sum(j.pods for j in jobs)} pods")
    index_of(snapshot)  # built once, shared by both runs
    aware_policy = Policy()
    blind_policy = replace(Policy(), group_topology="none")
    results = {}
    for label, policy in (("groups", aware_policy), ("group-blind", blind_policy)):
        started = time.perf_counter()
        results[label] = run(policy, snapshot, jobs)
        print(f"  ({label}: {time.perf_counter() - started:.1f} s)")
    print(f"{'run':<12} {'kept whole':>22} {'stranded GPUs':>14} {'first pod ms p50/p99':>21} "
          f"{'later pods ms p50/p99':>22} {'waited':>7}")
    for label, r in results.items():
        share = r.kept / r.possible if r.possible else float("nan")
        print(f"{label:<12} {r.kept:>6}/{r.possible:<6} {share:>8.1%} {statistics.mean(r.stranded):>14.0f} "
              f"{statistics.median(r.first_ms):>10.2f}/{pct(r.first_ms, 0.99):<10.2f} "
              f"{statistics.median(r.later_ms):>10.2f}/{pct(r.later_ms, 0.99):<11.2f} {r.waited:>7}")
    aware, blind = results["groups"], results["group-blind"]
    print("ratios (groups / group-blind): kept whole "
          f"{(aware.kept / aware.possible) / max(blind.kept / blind.possible, 1e-9):.2f}x, stranded GPUs "
          f"{statistics.mean(aware.stranded) / max(statistics.mean(blind.stranded), 1e-9):.2f}x, first-pod median "
          f"{statistics.median(aware.first_ms) / statistics.median(blind.first_ms):.2f}x, later-pod median "
          f"{statistics.median(aware.later_ms) / statistics.median(blind.later_ms):.2f}x")


if __name__ == "__main__":
    main()
