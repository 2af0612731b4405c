"""What the group tests share: watch caches of NVLink cliques, group references, a decider placing a
group's pod, and an app over a source whose decisions name a domain."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from server_support import fake_core, gpu_pod_review

from webhook.cluster.cache import KINDS, ClusterCache
from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Allocation, Snapshot, TopologyClass
from webhook.core.placement.groups import GroupRef, group_of
from webhook.core.policy.model import Policy
from webhook.policyfile.holder import PolicyHolder
from webhook.server.app import ServerConfig, create_app

H100 = "NVIDIA-H100-80GB-HBM3"


CLIQUE = "nvidia.com/gpu.clique"


def clique_node(name: str, clique: str, gpus: int = 4) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "nvidia.com/gpu.product": H100, "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": str(gpus),
            CLIQUE: clique,
        }},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)}},
    }


def pod(name: str, node: str | None, gpus: int = 4, namespace: str = "team-a", uid: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def cliques_cache(cliques: dict[str, int], clock: Callable[[], float] = lambda: 0.0,
                  pods: list[dict[str, Any]] | None = None) -> ClusterCache:
    """`cliques`: clique name -> nodes of 4 GPUs in it; namespaces team-a and team-b, no quota."""
    cache = ClusterCache(clock=clock)
    cache.replace("nodes", [clique_node(f"{c}-n{i}", c) for c, count in cliques.items() for i in range(count)])
    cache.replace("namespaces", [{"metadata": {"name": ns, "labels": {"gpu-admission.io/enabled": "true"}}}
                                 for ns in ("team-a", "team-b")])
    cache.replace("pods", pods or [])
    for kind in KINDS:
        if kind not in ("nodes", "namespaces", "pods"):
            cache.replace(kind, [])
        cache.heard(kind)
    return cache


def ref(name: str, size: int = 2, namespace: str = "team-a") -> GroupRef:
    return GroupRef(namespace, f"pytorchjob/{name}", size, "training.kubeflow.org/job-name")


def placed(group: GroupRef, clique: str, node: str, gpus: int = 4) -> Callable[[Snapshot], Decision]:
    """A stand-in for admit.validate: it returns the allocation the mutation recorded, as validate
    does, naming the group and the domain the mutation chose."""

    def decide(snapshot: Snapshot) -> Decision:
        time.sleep(0.001)  # validation takes about this long: racing threads overlap
        allocation = Allocation(node, tuple(range(gpus)), gpus, 81559, 100, "nvidia", H100, TopologyClass.NVLINK,
                                0.0, "binpack", group=group.key, domain=f"{CLIQUE}={clique}")
        return Decision(True, allocation=allocation)

    return decide


def worker_review(job: str, index: int, namespace: str = "team-a", dry_run: bool | None = None) -> dict[str, Any]:
    """A PyTorchJob worker pod as the training operator creates it: its labels name the job."""
    review = gpu_pod_review(namespace, gpus=4, uid=f"r-{job}-{index}", pod_uid=f"{job}-{index}",
                            name=f"{job}-worker-{index}", dry_run=dry_run)
    review["request"]["object"]["metadata"].update(
        labels={"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": str(index),
                "training.kubeflow.org/operator-name": "pytorchjob-controller"},
        annotations={"gpu-admission.io/group-size": "2"})
    return review


def domain_core(domains: Mapping[str, str]) -> Any:
    """A core whose validation returns the allocation the mutation recorded: the job's clique from
    `domains` ("" for a pod admitted with no domain, as the preferred mode does when none fits)."""

    def validate(pod: Mapping[str, Any], snapshot: Snapshot, policy: Any, *, namespace: str | None = None) -> Decision:
        group = group_of(pod, namespace or "")
        assert group is not None
        job = pod["metadata"]["labels"]["training.kubeflow.org/job-name"]
        index = int(pod["metadata"]["labels"]["training.kubeflow.org/replica-index"])
        clique = domains[job]
        return Decision(True, allocation=Allocation(
            f"{clique or 'x'}-n{index}", (0, 1, 2, 3), 4, 81559, 100, "nvidia", H100, TopologyClass.NVLINK, 0.0,
            "binpack", group=group.key, domain=f"{CLIQUE}={clique}" if clique else ""))

    return fake_core(validate=validate)


def post(client: Any, review: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/validate", json=review)
    assert response.status_code == 200
    answer: dict[str, Any] = response.get_json()["response"]
    return answer


def app_over(source: Any, domains: Mapping[str, str]) -> Any:
    return create_app(ServerConfig(source=source, core=domain_core(domains),
                                   policy=PolicyHolder(None, loader=lambda _path: Policy())))


def cluster_file(tmp_path: Path, cliques: dict[str, int]) -> str:
    """8-GPU H100 nodes in cliques (name -> nodes); namespace ml managed."""
    items = [textwrap.dedent(f"""\
        - apiVersion: v1
          kind: Node
          metadata:
            name: {clique}-{i}
            labels: {{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.memory: "81559",
                     nvidia.com/gpu.count: "8", {CLIQUE}: {clique}}}
          status:
            allocatable: {{cpu: "200", memory: 2000Gi, nvidia.com/gpu: "8"}}
        """) for clique, count in cliques.items() for i in range(count)]
    items.append(textwrap.dedent("""\
        - apiVersion: v1
          kind: Namespace
          metadata: {name: ml, labels: {gpu-admission.io/enabled: "true"}}
        """))
    path = tmp_path / "cluster.yaml"
    path.write_text("apiVersion: v1\nkind: List\nitems:\n" + "".join(items))
    return str(path)
