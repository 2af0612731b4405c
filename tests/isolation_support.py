"""What the isolation, zero-count, pod-update and record tests share: a small cluster with ConfigMaps, a pod
asking for no GPU, the two webhooks run as the API server chains them, and a pod UPDATE review."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonpatch
from builders import H100, node, snapshot
from server_support import cluster_objects

from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.admission.envfrom import env_from_keys
from webhook.core.domain.model import Node, Snapshot
from webhook.core.policy.model import Policy
from webhook.policyfile.holder import PolicyHolder
from webhook.server.admission import real_core
from webhook.server.app import ServerConfig, create_app
from webhook.server.source import StaticSource

VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
CONFIG_MAPS = {
    "team-a": {
        "settings": env_from_keys({"LOG_LEVEL": "info", "MODEL": "llama", "config.yaml": "x: 1"}),
        "escape": env_from_keys({"NVIDIA_VISIBLE_DEVICES": "all", "LOG_LEVEL": "info"}),
        "tails": env_from_keys({"DEVICES": "all", "PIPE_DIRECTORY": "/x"}),
        "preload": env_from_keys({"LD_PRELOAD": "/evil.so"}),
        "switch": env_from_keys({"GPU_CORE_UTILIZATION_POLICY": "disable"}),
    }
}
SNAP = dataclasses.replace(snapshot(node("h1", H100, 8), Node("cpu-1")), config_maps=CONFIG_MAPS)


def cpu_pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "team-a"},
        "spec": {"containers": list(containers) or [{"name": "app", "image": "nvcr.io/nvidia/cuda:12.4.1-base"}],
                 **spec},
    }


def chain(p: dict[str, Any], snap: Snapshot = SNAP, policy: Policy | None = None) -> tuple[Any, Any, Any]:
    """Mutate, apply the patch, validate the result (as the API server runs the two webhooks)."""
    policy = policy or Policy()
    mutated = admit.mutate(p, snap, policy)
    final = jsonpatch.apply_patch(p, list(mutated.patch)) if mutated.allowed else p
    return mutated, final, admit.validate(final, snap, policy)


def update_review(old: dict[str, Any], new: dict[str, Any], namespace: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-update", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "name": new["metadata"]["name"], "operation": "UPDATE", "userInfo": {"username": "alice"},
        "object": new, "oldObject": old}}


def answer(endpoint: str, review: dict[str, Any]) -> dict[str, Any]:
    config = ServerConfig(source=StaticSource(build_snapshot(cluster_objects())), namespace="gpu-admission",
                          core=real_core(), policy=PolicyHolder(None, loader=lambda _path: Policy()))
    response = create_app(config).test_client().post(endpoint, data=json.dumps(review),
                                                     content_type="application/json")
    assert response.status_code == 200
    result: dict[str, Any] = response.get_json()["response"]
    return result
