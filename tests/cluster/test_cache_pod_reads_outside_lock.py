"""A pod event is read (resources, usage, envFrom reads, claims) before the watch cache takes the lock that
every admission takes to read the snapshot: however large one tenant's pod, another tenant's admission
never waits for its parse."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from webhook.cluster import pod_read
from webhook.cluster.cache import ClusterCache


def gpu_pod(name: str, containers: int = 1) -> dict[str, Any]:
    spec = {"nodeName": "gpu-a", "containers": [
        {"name": f"c{i}", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        for i in range(containers)]}
    meta = {"name": name, "namespace": "team-a", "uid": f"uid-{name}"}
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": {"phase": "Running"}}


@pytest.mark.parametrize("listed", [False, True])
def test_a_pod_being_read_holds_no_lock_an_admission_needs(monkeypatch: pytest.MonkeyPatch, listed: bool) -> None:
    cache = ClusterCache(clock=lambda: 1000.0)
    cache.replace("pods", [])
    entered, release = threading.Event(), threading.Event()
    real = pod_read.pod_usage_of

    def slow_parse(obj: Any) -> Any:
        if obj["metadata"]["name"] == "huge":
            entered.set()
            assert release.wait(10), "the admission below never finished"
        return real(obj)

    monkeypatch.setattr(pod_read, "pod_usage_of", slow_parse)
    huge = gpu_pod("huge", containers=500)
    feed = (lambda: cache.replace("pods", [huge])) if listed else (lambda: cache.apply("pods", "ADDED", huge))
    watcher = threading.Thread(target=feed)
    watcher.start()
    assert entered.wait(10)
    # The pod is still being read on the watch thread: an admission reads the snapshot meanwhile.
    admission = threading.Thread(target=cache.snapshot)
    admission.start()
    admission.join(5)
    finished = not admission.is_alive()
    release.set()
    watcher.join(10)
    assert finished, "the snapshot waited for another pod's parse"
    assert len(cache._pods) == 1  # and, once read, it is stored


def test_what_is_stored_is_what_a_read_under_the_lock_would_store() -> None:
    pods = [gpu_pod(f"p{i}", containers=1 + i % 3) for i in range(6)]
    early, late = ClusterCache(clock=lambda: 1000.0), ClusterCache(clock=lambda: 1000.0)
    early.replace("pods", pods)
    late.replace("pods", [])
    for pod in pods:
        late.apply("pods", "ADDED", pod)
    assert early.snapshot().usage == late.snapshot().usage
    assert {k: (p.use, p.node) for k, p in early._pods.items()} == {k: (p.use, p.node) for k, p in late._pods.items()}
