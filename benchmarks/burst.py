"""Shared state under job launches, against the real API server of tests/e2e: one replica keeping
reservations in memory, then three electing one decider (the chart's default), each taking a 512-pod
burst into one namespace and a fan-out over 20 namespaces, from 16 client threads.

For each it counts what the issue of shared state is about:
- timeouts: creates answered after `timeoutSeconds - 1` (4 s) or failed calling the webhook;
- phantoms: reservations still held a few seconds after the burst for pods the API server does not
  have (a pod it refused must hold nothing);
- writes per pod: ConfigMap and Lease writes (POST/PUT/PATCH/DELETE, from the API server's own request
  counter) per admitted pod, and the bytes of state objects written per 100 pods (writes times the
  largest object written, an upper bound);
- over-commits: namespaces past their GPU quota, and nodes whose planned pods ask for more
  `nvidia.com/gpu` units than the node advertises;
- throughput of three replicas over one, on the fan-out.

    python benchmarks/burst.py [--burst 512] [--fanout 5000]

Ends with one JSON line: {"api": "real", "replicas": 3, "timeouts": N, "phantoms": N, "writes_per_pod": X,
"etcd_bytes_per_100_pods": N, "overcommits": N, "throughput_3_over_1": X}. Needs Go (the control plane is
built from its modules, cached under ~/.cache); where it cannot be built it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from apiserver_admission import THREADS, TIMEOUT_SECONDS, Client, Phase  # noqa: E402
from e2e.controlplane import ControlPlane, start_control_plane  # noqa: E402
from e2e.harness import (  # noqa: E402
    Webhook,
    api_client,
    create_inventory,
    create_namespace,
    create_node,
    demo_objects,
    install,
)
from kubernetes import client  # noqa: E402

RECORD = "gpu-admission.io/allocation"


def state_writes(plane: ControlPlane) -> float:
    """ConfigMap and Lease writes the API server has served so far (all clients)."""
    _, text = Client(plane).request("GET", "/metrics")
    total = 0.0
    for line in text.decode().splitlines():
        if (line.startswith("apiserver_request_total{") and re.search(r'resource="(configmaps|leases)"', line)
                and re.search(r'verb="(POST|PUT|PATCH|DELETE)"', line)):
            total += float(line.rsplit(" ", 1)[1])
    return total


def gauge(webhook: Webhook, name: str) -> float:
    pattern = re.compile(rf"^{name} (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(webhook.metrics()))


def max_gauge(webhook: Webhook, name: str) -> float:
    pattern = re.compile(rf"^{name} (\S+)$", re.M)
    return max((float(v) for v in pattern.findall(webhook.metrics())), default=0.0)


def overcommits(core: client.CoreV1Api, quotas: dict[str, int]) -> int:
    """GPUs past each namespace's quota, plus units past each node's allocatable, by the pods' records."""
    per_namespace: Counter[str] = Counter()
    per_node: Counter[str] = Counter()
    for pod in core.list_pod_for_all_namespaces().items:
        record = (pod.metadata.annotations or {}).get(RECORD)
        if not record:
            continue
        decided = json.loads(record)
        per_namespace[pod.metadata.namespace] += int(decided.get("gpuCount") or 0)
        if decided.get("node"):
            per_node[decided["node"]] += int(decided.get("gpuCount") or 0)
    over = sum(max(0, used - quotas[ns]) for ns, used in per_namespace.items() if ns in quotas)
    for node in core.list_node().items:
        units = int((node.status.allocatable or {}).get("nvidia.com/gpu", "0"))
        over += max(0, per_node.get(node.metadata.name, 0) - units) if units else 0
    return over


def run(plane: ControlPlane, admin: client.ApiClient, webhook: Webhook, replicas: int, args: argparse.Namespace,
        prefix: str) -> dict[str, Any]:
    webhook.scale(replicas, "memory" if replicas == 1 else "leader")
    core = client.CoreV1Api(admin)
    quotas: dict[str, int] = {}
    for i in range(21):
        name = f"{prefix}-{i}"
        create_namespace(admin, name)
        quotas[name] = args.burst * 3 // 4 if i == 0 else args.fanout  # the burst meets its quota
        core.create_namespaced_resource_quota(
            name, {"metadata": {"name": "gpu"}, "spec": {"hard": {"requests.nvidia.com/gpu": str(quotas[name])}}})
    time.sleep(1.0)
    Phase(plane, "warm-up").run([(f"{prefix}-1", f"w{i}") for i in range(8)], 4)
    writes_before = state_writes(plane)
    burst = Phase(plane, f"{replicas} replica(s): burst of {args.burst} into one namespace").run(
        [(f"{prefix}-0", f"b{i}") for i in range(args.burst)], THREADS)
    fanout = Phase(plane, f"{replicas} replica(s): fan-out of {args.fanout} over 20 namespaces").run(
        [(f"{prefix}-{1 + i % 20}", f"f{i}") for i in range(args.fanout)], THREADS)
    writes = state_writes(plane) - writes_before
    time.sleep(3.0)  # the watch catches up; what reservations still hold then is a phantom
    phantoms = int(gauge(webhook, "gpu_admission_reservations"))
    admitted = len(burst.latencies) + len(fanout.latencies) - burst.failures - fanout.failures
    largest = max_gauge(webhook, "gpu_admission_largest_written_object_bytes")
    late = sum(1 for s in burst.latencies + fanout.latencies if s > TIMEOUT_SECONDS - 1)
    failed_calls = 0  # refusals other than ours: the API server's "failed calling webhook"
    for phase in (burst, fanout):
        print(phase.row(None))
    for text in (burst.messages + fanout.messages):
        failed_calls += "failed calling webhook" in text
    return {
        "replicas": replicas,
        "timeouts": late + failed_calls,
        "phantoms": phantoms,
        "writes_per_pod": round(writes / max(admitted, 1), 3),
        "etcd_bytes_per_100_pods": round(writes * largest / max(admitted, 1) * 100),
        "overcommits": overcommits(core, quotas),
        "fanout_pods_per_s": round(fanout.rate, 1),
        "burst_pods_per_s": round(burst.rate, 1),
        "admitted": admitted,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=512, help="pods of the job launch into one namespace")
    parser.add_argument("--fanout", type=int, default=5000, help="pods spread over 20 namespaces")
    args = parser.parse_args()
    try:
        plane = start_control_plane(scheduler=False)
    except Exception as error:  # no Go, no module proxy: nothing here can stand in for the API server
        print(f"the control plane could not be built or started ({error}); this benchmark needs it")
        return 2
    webhook: Webhook | None = None
    try:
        admin = api_client(plane.admin_kubeconfig)
        webhook = install(plane, admin, values={})
        for inventory in demo_objects("GPUInventory"):
            create_inventory(admin, inventory)
        for node in demo_objects("Node"):
            create_node(admin, node)
        one = run(plane, admin, webhook, 1, args, "one")
        three = run(plane, admin, webhook, 3, args, "three")
    finally:
        if webhook is not None:
            webhook.stop()
        plane.stop()
    print(json.dumps({"replicas_1": one, "replicas_3": three}))
    print(json.dumps({
        "api": "real", "replicas": 3, "timeouts": three["timeouts"], "phantoms": three["phantoms"],
        "writes_per_pod": three["writes_per_pod"], "etcd_bytes_per_100_pods": three["etcd_bytes_per_100_pods"],
        "overcommits": three["overcommits"],
        "throughput_3_over_1": round(three["fanout_pods_per_s"] / max(one["fanout_pods_per_s"], 0.001), 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
