"""Placement quality on the webhook's path: the openb trace's GPU tasks decided by `gpu-admission check`.

The trace's nodes become Node objects as a cluster file for `check --cluster` has them (GPU Feature
Discovery labels, allocatable CPU, memory and GPUs) and its GPU tasks become Pod manifests (GPU count,
`gpumem-percentage` and `gpucores` for a share, CPU and memory requests, `use-gputype` for the models a
task accepts). They are written to files and decided by the CLI's own code path (the same loaders and
`check.evaluate`: mutate, patch, validate, count the admitted pod) in arrival order, nothing departing,
under a policy file `defaults: {placement: fragmentation}` with no `workloadMix`. Unallocated GPU % at
100 % arrived is printed beside `simulate`'s figure (`replay`, fragmentation policy) for the very same
arrivals and seed. Tasks asking for no GPU are left out of both.

    python benchmarks/trace_webhook_path.py [TRACE_DIR] [--workload default] [--seed 42] [--nodes N]

`--nodes N` takes N nodes spread evenly over the node list (the models' mix kept) and the arrivals drawn
for that smaller capacity, for a quicker run; 0 (default) takes all.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from webhook.cluster.files import load_cluster  # noqa: E402
from webhook.cluster.translate import build_snapshot  # noqa: E402
from webhook.commands.check import evaluate  # noqa: E402
from webhook.commands.simulate import NODE_FILE, POD_FILE  # noqa: E402
from webhook.core.domain.model import Node  # noqa: E402
from webhook.manifests import read_all  # noqa: E402
from webhook.policyfile.read import load_policy  # noqa: E402
from webhook.simulate.replay import Run, capacity_milli, replay, workload  # noqa: E402
from webhook.simulate.trace import MILLI, NAMESPACE, TracePod, load_nodes, load_pods  # noqa: E402
from webhook.workloads import workloads  # noqa: E402

TUNE = 1.05  # arrivals up to 105 % of capacity: the figure is read at 100 %


def node_object(node: Node) -> dict[str, Any]:
    card = node.gpus[0].memory_mib if node.gpus else 0
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": {
            "nvidia.com/gpu.product": node.gpu_model, "nvidia.com/gpu.memory": str(card),
            "nvidia.com/gpu.count": str(len(node.gpus))}},
        "status": {"allocatable": {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi",
                                   "nvidia.com/gpu": str(len(node.gpus)), "pods": "110"}},
    }


def pod_manifest(pod: TracePod, i: int) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": pod.gpus}
    if pod.milli < MILLI:  # a share of both compute and memory, as simulate's trace.to_request asks
        share = -(-pod.milli // 10)
        limits["nvidia.com/gpumem-percentage"] = share
        limits["nvidia.com/gpucores"] = share
    metadata: dict[str, Any] = {"name": f"task-{i}", "namespace": NAMESPACE}
    if pod.models:
        metadata["annotations"] = {"nvidia.com/use-gputype": ",".join(pod.models)}
    resources = {"limits": limits, "requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "task", "image": "trace", "resources": resources}]}}


def through_check(nodes: list[Node], arrivals: list[TracePod], workdir: Path) -> tuple[Run, float]:
    """The arrivals decided by check's code path; the Run of what it placed, and the seconds it took."""
    cluster = workdir / "cluster.json"
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": NAMESPACE, "labels": {"gpu-admission.io/enabled": "true"}}}
    cluster.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                   "items": [*map(node_object, nodes), namespace]}))
    manifests = workdir / "pods.json"
    manifests.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                     "items": [pod_manifest(p, i) for i, p in enumerate(arrivals)]}))
    policy_file = workdir / "policy.yaml"
    policy_file.write_text("defaults:\n  placement: fragmentation\n")
    started = time.perf_counter()
    policy = load_policy(policy_file)
    snapshot = build_snapshot(load_cluster([str(cluster)]), dra_classes=policy.dra_device_classes)
    results = evaluate(workloads(read_all([str(manifests)])), snapshot, policy, NAMESPACE)
    seconds = time.perf_counter() - started
    if len(results) != len(arrivals):
        raise SystemExit(f"check decided {len(results)} pods of {len(arrivals)}")
    arrived_log: array[int] = array("q")
    allocated_log: array[int] = array("q")
    arrived = allocated = failed = 0
    for pod, result in zip(arrivals, results, strict=True):
        arrived += pod.gpu_milli
        if result.allowed and result.allocation is not None and result.allocation.get("node"):
            allocated += pod.gpu_milli
        else:
            failed += 1
        arrived_log.append(arrived)
        allocated_log.append(allocated)
    return Run("check", 0, capacity_milli(nodes), arrived_log, allocated_log, failed, seconds), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="../shared/traces/alibaba-gpu-v2023")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--nodes", type=int, default=0, help="take N nodes spread over the list (0: all)")
    args = parser.parse_args()
    trace = Path(args.trace)
    nodes = load_nodes(trace / NODE_FILE)
    if 0 < args.nodes < len(nodes):
        step = len(nodes) / args.nodes
        nodes = [nodes[int(i * step)] for i in range(args.nodes)]
    gpu_tasks = [p for p in load_pods(trace / POD_FILE.format(args.workload)) if p.gpus]
    arrivals = workload(gpu_tasks, capacity_milli(nodes), args.seed, TUNE)
    print(f"trace {trace / POD_FILE.format(args.workload)}: {len(nodes)} nodes, "
          f"{sum(len(n.gpus) for n in nodes)} GPUs, {len(arrivals)} GPU tasks arriving (seed {args.seed})")
    started = time.perf_counter()
    simulated = replay(nodes, arrivals, "fragmentation", args.seed)
    sim_seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        checked, check_seconds = through_check(nodes, arrivals, Path(tmp))
    sim_at, check_at = simulated.unallocated_pct(100), checked.unallocated_pct(100)
    print(f"simulate (replay, fragmentation): unallocated at 100 %: {sim_at:.2f} %  ({sim_seconds:.1f} s)")
    print(f"check (webhook path, no mix):     unallocated at 100 %: {check_at:.2f} %  ({check_seconds:.1f} s, "
          f"{len(arrivals) / check_seconds:,.0f} pods/s)")
    if sim_at is not None and check_at is not None:
        print(f"difference: {check_at - sim_at:+.2f} points")
    if "mix" in inspect.signature(replay).parameters:  # where simulate can take the webhook's fallback mix
        fixed = replay(nodes, arrivals, "fragmentation", args.seed, mix="default").unallocated_pct(100)
        print(f"simulate with the default mix (the webhook's when it has learned none): {fixed:.2f} %")


if __name__ == "__main__":
    main()
