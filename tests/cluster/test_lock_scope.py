"""No lock shared with other namespaces is held while a pod is parsed, screened or patched: the live
source's plan lock (mutation), the reservation store's lock (validation) and the source's view lock
cover only placement and quota. Shown two ways: a lock wrapper that records what ran under it, and a
pod whose parse is held hostage on one thread while another namespace's pod is admitted on another."""

from __future__ import annotations

import base64
import copy
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jsonpatch
import pytest
from server_support import cluster_objects, review_answer

from webhook.cluster.cache import KINDS, ClusterCache
from webhook.cluster.reservations import InProcessStore, Ledger
from webhook.cluster.source import LiveSource
from webhook.core.admission import envfrom, mutate, screen, validate
from webhook.core.policy.model import Policy
from webhook.policyfile.holder import PolicyHolder
from webhook.server.app import ServerConfig, create_app

KIND_OF = {"Node": "nodes", "Namespace": "namespaces", "ResourceQuota": "resourcequotas"}


class WatchedLock:
    """A lock that knows which threads hold it."""

    def __init__(self, inner: Any, holders: set[int]) -> None:
        self.inner, self.holders = inner, holders
        self.depth: dict[int, int] = {}

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self.inner.acquire(blocking, timeout))
        if got:
            me = threading.get_ident()
            self.depth[me] = self.depth.get(me, 0) + 1
            self.holders.add(me)
        return got

    def release(self) -> None:
        me = threading.get_ident()
        self.depth[me] -= 1
        if not self.depth[me]:
            self.holders.discard(me)
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: Any) -> None:
        self.release()


class Rig:
    """The webhook's app over a live source (a synced watch cache, reservations in memory) whose shared
    locks are watched."""

    def __init__(self) -> None:
        cache = ClusterCache()
        by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        for obj in cluster_objects(quota_gpus=8):
            by_kind[KIND_OF[obj["kind"]]].append(obj)
        for kind in KINDS:
            cache.replace(kind, by_kind[kind])
            cache.heard(kind)
        store = InProcessStore()
        self.source = LiveSource(cache, Ledger(store, clock=cache.clock))
        self.holders: set[int] = set()
        self.source._plan_lock = WatchedLock(self.source._plan_lock, self.holders)  # type: ignore[assignment]
        self.source._view_lock = WatchedLock(self.source._view_lock, self.holders)  # type: ignore[assignment]
        store._lock = WatchedLock(store._lock, self.holders)  # type: ignore[assignment]
        config = ServerConfig(source=self.source, namespace="gpu-admission", record_key=b"k" * 32,
                              policy=PolicyHolder(None, loader=lambda _path: Policy()))
        self.client = create_app(config).test_client()

    def locked(self) -> bool:
        return threading.get_ident() in self.holders

    def post(self, endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
        return review_answer(self.client, endpoint, request)

    def create(self, pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The pod through /mutate, then (patched) through /validate: both answers."""
        namespace = pod["metadata"]["namespace"]
        request: dict[str, Any] = {
            "uid": f"r-{namespace}-{pod['metadata']['name']}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
            "operation": "CREATE", "userInfo": {"username": "alice"}, "object": pod}
        mutated = self.post("/mutate", request)
        assert mutated["allowed"], mutated
        created = jsonpatch.apply_patch(copy.deepcopy(pod), json.loads(base64.b64decode(mutated["patch"])))
        return mutated, self.post("/validate", {**request, "object": created})


def gpu_pod(name: str, namespace: str = "team-a", *, containers: int = 3) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"name": f"c{i}", "image": "x", "env": [{"name": "A", "value": "1"}],
                                    "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "APP_"}]}
                                   for i in range(containers)]
    items[0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": {"containers": items, "tolerations": [{"key": "t", "operator": "Exists"}]}}


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield Rig()


def spy(monkeypatch: pytest.MonkeyPatch, rig: Rig, module: Any, name: str, seen: list[tuple[str, bool]],
        before: Callable[[tuple[Any, ...]], None] | None = None) -> None:
    """Record, for each call of module.name, whether a shared lock was held."""
    real = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        seen.append((name, rig.locked()))
        if before is not None:
            before(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


def test_parsing_screening_and_patching_run_outside_every_shared_lock(monkeypatch: pytest.MonkeyPatch,
                                                                       rig: Rig) -> None:
    seen: list[tuple[str, bool]] = []
    for module, name in ((screen, "parse_pod"), (envfrom, "env_from"), (mutate, "_patch"),
                         (validate, "_against_record"), (mutate, "place"), (validate, "check_quota")):
        spy(monkeypatch, rig, module, name, seen)
    mutated, validated = rig.create(gpu_pod("train"))
    assert mutated["allowed"] and validated["allowed"]
    ran = {name for name, _ in seen}
    assert ran == {"parse_pod", "env_from", "_patch", "_against_record", "place", "check_quota"}
    assert not [name for name, locked in seen if locked and name in ("parse_pod", "env_from", "_patch",
                                                                     "_against_record")]
    # ...and the decision that needs the shared picture still runs under its lock
    assert ("place", True) in seen and ("check_quota", True) in seen


@pytest.mark.parametrize("held_in", ["mutate", "validate"])
def test_another_namespace_is_admitted_while_a_pod_is_being_parsed(monkeypatch: pytest.MonkeyPatch, rig: Rig,
                                                                    held_in: str) -> None:
    entered, release = threading.Event(), threading.Event()
    phase = {"validating": False}

    def hostage(args: tuple[Any, ...]) -> None:
        pod = args[0]  # the pod's view, as the admission reads it once
        if (pod.name == "slow" and (held_in == "validate") == phase["validating"]
                and not entered.is_set()):
            entered.set()
            assert release.wait(30)

    seen: list[tuple[str, bool]] = []
    spy(monkeypatch, rig, screen, "parse_pod", seen, hostage)
    real_post = rig.post

    def post(endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
        if request["object"]["metadata"]["name"] == "slow":
            phase["validating"] = endpoint == "/validate"
        return real_post(endpoint, request)

    rig.post = post  # type: ignore[method-assign]
    slow: dict[str, Any] = {}
    first = threading.Thread(target=lambda: slow.update(zip(("mutated", "validated"), rig.create(
        gpu_pod("slow", containers=200)), strict=True)))
    first.start()
    try:
        assert entered.wait(30)
        other: dict[str, Any] = {}
        second = threading.Thread(target=lambda: other.update(zip(("mutated", "validated"), rig.create(
            gpu_pod("fast", "default")), strict=True)))
        second.start()
        second.join(10)
        assert not second.is_alive(), "the other namespace's admission waited for the parse"
        assert other["mutated"]["allowed"] and other["validated"]["allowed"]
    finally:
        release.set()
        first.join(30)
    assert slow["mutated"]["allowed"] and slow["validated"]["allowed"]
