"""Pods near the API server's 3 MiB object limit, with tens of thousands of containers, are answered
correctly and briefly (benchmarks/big_pods.py measures that the work stays linear; nothing is timed here)."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
from builders import A100, H100, node, snapshot
from server_support import cluster_objects

from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit, screen
from webhook.core.policy.model import Policy
from webhook.server.app import ServerConfig, create_app
from webhook.server.review import MAX_BODY_BYTES, decode_patch
from webhook.server.source import StaticSource

CLUSTER = snapshot(node("h1", H100, 8), node("a1", A100, 8, "paired"))
N = 20000


def big(shape: dict[str, Any], first: dict[str, Any] | None = None) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": "x", **json.loads(json.dumps(shape))} for i in range(N)]
    if first is not None:
        containers[0]["resources"] = {"limits": first}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": "team-a"},
            "spec": {"containers": containers}}


def test_a_gpu_slice_among_twenty_thousand_containers_is_admitted_exactly() -> None:
    pod = big({"env": [{"name": "MODE", "value": "x"}]}, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"})
    m = admit.mutate(pod, CLUSTER, Policy())
    assert m.allowed and m.allocation is not None and (m.allocation.memory_mib, m.allocation.gpu_count) == (8000, 1)
    final = jsonpatch.apply_patch(pod, [dict(op) for op in m.patch])
    first = final["spec"]["containers"][0]
    assert first["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "8000m"} in first["env"]
    # The other containers keep their own variable and get no GPU limit (they hold no GPU).
    assert all({"name": "MODE", "value": "x"} in c["env"] for c in final["spec"]["containers"])
    assert not any(e["name"].startswith("CUDA_DEVICE_MEMORY_LIMIT") for c in final["spec"]["containers"][1:]
                   for e in c["env"])
    final["metadata"]["uid"] = "big-1"
    v = admit.validate(final, CLUSTER, Policy())
    assert v.allowed and v.allocation == m.allocation
    again = admit.mutate(final, CLUSTER, Policy())
    assert (again.allowed, again.patch) == (True, ())


def test_twenty_thousand_breaches_make_one_short_denial() -> None:
    pod = big({"resources": {"limits": {"nvidia.com/gpu": "1"}}, "env": [{"name": "LD_PRELOAD", "value": "/x.so"}]})
    d = admit.mutate(pod, CLUSTER, Policy())
    assert (d.allowed, d.code, d.reason) == (False, 403, "isolation-env")
    assert d.message.count("LD_PRELOAD") == screen.MAX_VIOLATIONS and d.message.endswith("; and 19995 more")
    assert "container 'c0'" in d.message and len(d.message) < 2000


def test_twenty_thousand_unknown_accelerators_make_a_few_warnings() -> None:
    pod = big({"resources": {"limits": {"amd.com/gpu": "1"}}}, {"nvidia.com/gpu": "1"})
    d = admit.mutate(pod, CLUSTER, Policy())
    assert d.allowed and 1 <= len(d.warnings) <= 11
    assert d.warnings[-1].startswith("more warnings left out")


def test_the_server_answers_a_pod_near_the_body_limit() -> None:
    pod = big({"env": [{"name": "MODE", "value": "x"}, {"name": "RANK", "value": "0"}]}, {"nvidia.com/gpu": "1"})
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "big", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team-a",
        "operation": "CREATE", "userInfo": {"username": "alice"}, "object": pod}}
    raw = json.dumps(review, separators=(",", ":")).encode()
    assert MAX_BODY_BYTES // 2 < len(raw) <= MAX_BODY_BYTES
    client = create_app(ServerConfig(source=StaticSource(build_snapshot(cluster_objects())))).test_client()
    response = client.post("/mutate", data=raw, content_type="application/json").get_json()["response"]
    assert response["allowed"]
    final = jsonpatch.apply_patch(pod, decode_patch(response))
    assert {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "81559m"} in final["spec"]["containers"][0]["env"]
    assert final["spec"]["containers"][N - 1]["env"][:2] == pod["spec"]["containers"][N - 1]["env"]
