"""What the reservation and group ledger tests share: small watch caches, a fake ConfigMaps API with
resourceVersion preconditions, and a race of threads."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client import V1ConfigMap, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

from webhook.cluster.cache import KINDS, ClusterCache
from webhook.core.domain.decision import Decision

H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": H100,
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)}},
    }


def running(name: str, gpus: int, node_name: str | None = "n1", namespace: str = "team-a") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec,
        "status": {"phase": "Running"},
    }


def cluster_cache(used: int, quota: int = 8, clock: Callable[[], float] = lambda: 0.0) -> ClusterCache:
    """Two 8-GPU nodes; team-a's quota is `quota` GPUs, of which `used` are taken by running pods."""
    cache = ClusterCache(clock=clock)
    cache.replace("nodes", [node("n1", 8), node("n2", 8)])
    cache.replace("gpuinventories", [])
    cache.replace(
        "namespaces",
        [
            {"metadata": {"name": "team-a", "labels": {"gpu-admission.io/enabled": "true"}}},
            {"metadata": {"name": "team-b", "labels": {"gpu-admission.io/enabled": "true"}}},
        ],
    )
    cache.replace(
        "resourcequotas",
        [
            {
                "metadata": {"name": "gpus", "namespace": "team-a"},
                "spec": {"hard": {"requests.nvidia.com/gpu": str(quota)}},
            },
        ],
    )
    cache.replace("pods", [running(f"old-{i}", 1) for i in range(used)])
    for kind in KINDS:
        if kind not in ("nodes", "gpuinventories", "namespaces", "resourcequotas", "pods"):
            cache.replace(kind, [])  # listed, none here (DRA claims, ...)
        cache.heard(kind)
    return cache


def race(admit: Callable[[int], Decision], threads: int = 50) -> list[int]:
    """Runs admit(i) on `threads` threads released together; returns the indices admitted."""
    barrier = threading.Barrier(threads)
    admitted: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        barrier.wait()
        if admit(i).allowed:
            with lock:
                admitted.append(i)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sorted(admitted)


class FakeConfigMaps:
    """The three CoreV1Api ConfigMap calls the ApiStore makes, with resourceVersion preconditions and
    extra 409 Conflicts injected at random (as when another writer slips in between read and write)."""

    def __init__(self, conflict_rate: float = 0.3, seed: int = 7) -> None:
        self.objects: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
        self.version = 100
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.conflict_rate = conflict_rate
        self.injected = 0
        self.writes = 0

    def _object(self, namespace: str, name: str, version: int, data: dict[str, str]) -> V1ConfigMap:
        return V1ConfigMap(
            metadata=V1ObjectMeta(name=name, namespace=namespace, resource_version=str(version)), data=dict(data)
        )

    def read_namespaced_config_map(self, name: str, namespace: str) -> V1ConfigMap:
        with self.lock:
            if (namespace, name) not in self.objects:
                raise ApiException(status=404, reason="Not Found")
            version, data = self.objects[(namespace, name)]
            return self._object(namespace, name, version, data)

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> V1ConfigMap:
        with self.lock:
            name = body["metadata"]["name"]
            if (namespace, name) in self.objects:
                raise ApiException(status=409, reason="AlreadyExists")
            return self._store(namespace, name, body)

    def replace_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any]) -> V1ConfigMap:
        with self.lock:
            if (namespace, name) not in self.objects:
                raise ApiException(status=404, reason="Not Found")
            if body["metadata"].get("resourceVersion") != str(self.objects[(namespace, name)][0]):
                raise ApiException(status=409, reason="Conflict")
            if self.rng.random() < self.conflict_rate:
                self.injected += 1
                self.version += 1  # someone else's write
                self.objects[(namespace, name)] = (self.version, self.objects[(namespace, name)][1])
                raise ApiException(status=409, reason="Conflict")
            return self._store(namespace, name, body)

    def _store(self, namespace: str, name: str, body: dict[str, Any]) -> V1ConfigMap:
        self.version += 1
        self.writes += 1
        self.objects[(namespace, name)] = (self.version, dict(body["data"]))
        return self._object(namespace, name, self.version, body["data"])

    def uids(self, namespace: str = "team-a") -> list[str]:
        _, data = self.objects[("gpu-admission", f"gpu-admission-ledger-{namespace}")]
        return sorted(entry["uid"] for entry in json.loads(data["reservations"]))
