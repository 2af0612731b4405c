"""The watch cache fed by recorded list responses and watch streams (tests/data/watch/), through the
same Reflector loop a live cluster drives; only the two functions that fetch the JSON are fakes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from webhook.cluster.cache import KINDS, ClusterCache
from webhook.cluster.translate import build_snapshot
from webhook.cluster.watch import Backoff, Reflector
from webhook.core.domain.model import Gpu, GpuUsage, Namespace, NodeUsage, QuotaLimits, Taint, Usage

DATA = Path(__file__).parent.parent / "data" / "watch"
ITEM_KIND = {
    "nodes": "Node",
    "pods": "Pod",
    "namespaces": "Namespace",
    "resourcequotas": "ResourceQuota",
    "gpuinventories": "GPUInventory",
    "resourceclaims": "ResourceClaim",
    "resourceclaimtemplates": "ResourceClaimTemplate",
    "configmaps": "ConfigMap",
}
A100, L4 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"
FREE = GpuUsage()


def whole(memory: int) -> GpuUsage:
    return GpuUsage(memory, 100, 1, True)


class Recorded:
    """list_fn / stream_fn replaying the recorded files; each stage ends by setting `stop`."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.lists: dict[str, list[str]] = {k: sorted(p.name for p in DATA.glob(f"{k}.list*.json")) for k in KINDS}
        self.streams: dict[str, list[str]] = {}
        self.watched_from: dict[str, list[str]] = {k: [] for k in KINDS}

    def list_fn(self, kind: str) -> Iterator[Mapping[str, Any]]:
        if not self.lists[kind]:
            self.stop.set()
            raise AssertionError(f"{kind}: listed more often than recorded")
        yield json.loads((DATA / self.lists[kind].pop(0)).read_text())

    def stream_fn(self, kind: str, resource_version: str, timeout: int) -> Iterator[Mapping[str, Any]]:
        self.watched_from[kind].append(resource_version)
        if not self.streams[kind]:
            self.stop.set()
            raise AssertionError(f"{kind}: watched more often than recorded")
        name = self.streams[kind].pop(0)
        for line in (DATA / name).read_text().splitlines():
            yield json.loads(line)
        if not self.streams[kind]:
            self.stop.set()


class Mirror:
    """The objects the cluster holds after the same events, for the build_snapshot cross-check."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in KINDS}

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str:
        meta = obj["metadata"]
        return str(meta.get("uid") or meta["name"])

    def listed(self, kind: str, name: str) -> None:
        items = json.loads((DATA / name).read_text())["items"]
        fresh = {self.key(o): {"kind": ITEM_KIND[kind], **o} for o in items}
        for key in [k for k in self.objects[kind] if k not in fresh]:
            del self.objects[kind][key]
        self.objects[kind].update(fresh)

    def streamed(self, kind: str, name: str) -> None:
        for line in (DATA / name).read_text().splitlines():
            event = json.loads(line)
            if event["type"] in ("ADDED", "MODIFIED"):
                self.objects[kind][self.key(event["object"])] = event["object"]
            elif event["type"] == "DELETED":
                self.objects[kind].pop(self.key(event["object"]), None)

    def all(self) -> list[dict[str, Any]]:
        return [o for kind in KINDS for o in self.objects[kind].values()]


@pytest.fixture()
def feed() -> tuple[ClusterCache, Recorded, dict[str, Reflector]]:
    cache = ClusterCache(clock=lambda: 1000.0)
    recorded = Recorded()
    reflectors = {
        kind: Reflector(
            kind, recorded.list_fn, recorded.stream_fn, cache, backoff=Backoff(initial=0.0), stop=recorded.stop
        )
        for kind in KINDS
    }
    return cache, recorded, reflectors


def run_stage(recorded: Recorded, reflectors: dict[str, Reflector], streams: dict[str, list[str]]) -> None:
    for kind, names in streams.items():
        recorded.streams[kind] = list(names)
        recorded.stop.clear()
        reflectors[kind].run()
        assert recorded.streams[kind] == [], f"{kind}: streams left unread"


STAGE_1 = {k: [f"{k}.watch1.jsonl"] for k in KINDS}
STAGE_2 = {**{k: [f"{k}.watch2.jsonl"] for k in KINDS}, "pods": ["pods.watch2.jsonl", "pods.watch3.jsonl"]}


def test_lists_then_streams_give_exact_snapshots(feed: tuple[ClusterCache, Recorded, dict[str, Reflector]]) -> None:
    cache, recorded, reflectors = feed
    mirror = Mirror()
    assert not cache.synced() and cache.unsynced() == list(KINDS)

    # Stage 0: every kind listed (the first watch of each is empty apart from a bookmark-free close).
    for kind in KINDS:
        reflectors[kind].list_once()
        mirror.listed(kind, f"{kind}.list1.json")
    assert cache.synced()
    snap = cache.snapshot()
    assert set(snap.nodes) == {"gpu-a", "gpu-b", "cpu-0"}
    gpu_a, gpu_b, cpu_0 = snap.nodes["gpu-a"], snap.nodes["gpu-b"], snap.nodes["cpu-0"]
    assert gpu_a.inventory_source == "inventory" and gpu_a.gpus[3] == Gpu(3, "GPU-gpu-a-3", A100, 81920, 1, True)
    assert gpu_a.nvlink[0] == (0, 12, 12, 12) and gpu_a.pcie[1] == ("NODE", "X", "NODE", "NODE")
    assert gpu_b.inventory_source == "labels" and [g.uuid for g in gpu_b.gpus] == ["gpu-b-gpu-0", "gpu-b-gpu-1"]
    assert (cpu_0.gpus, cpu_0.cpu_milli, cpu_0.memory_mib) == ((), 16000, 65536)
    assert snap.usage == {
        "gpu-a": NodeUsage((whole(81920), whole(81920), FREE, FREE), 8000, 65536, 1),
        "gpu-b": NodeUsage((GpuUsage(8192, 30, 1, False), FREE), 2000, 8192, 1),
        "cpu-0": NodeUsage((), 500, 1024, 0),
    }
    assert snap.namespace_usage == {"team-a": Usage(3, 172032, 230), "team-b": Usage(1, 0, 100)}
    assert snap.quotas == {
        "team-a": (QuotaLimits("gpu-quota", 8, 300000, None),),
        "team-b": (QuotaLimits("gpu-quota", 2, None, None),),
    }
    assert {n: ns.managed for n, ns in snap.namespaces.items()} == {"default": False, "team-a": True, "team-b": True}
    counts = {k: c.requests[0][1][0].count for k, c in snap.claims.items()}
    assert counts == {"team-a/one-gpu": 1, "team-b/four-gpus": 4}
    assert set(snap.claim_templates) == {"team-a/gpu-claim-template"}
    # ConfigMaps keep only the keys envFrom could turn into isolation variables; no value is kept.
    assert snap.config_maps == {
        "team-a": {"app-settings": frozenset(), "gpu-escape": frozenset({"NVIDIA_VISIBLE_DEVICES"})},
        "team-b": {"kube-root-ca.crt": frozenset()},
    }
    assert snap == build_snapshot(mirror.all())

    # Stage 1: one stream per kind: heartbeat, bookmark, a new node, an inventory, binding, completion.
    run_stage(recorded, reflectors, STAGE_1)
    for kind in KINDS:
        mirror.streamed(kind, f"{kind}.watch1.jsonl")
    snap = cache.snapshot()
    assert set(snap.nodes) == {"gpu-a", "gpu-b", "gpu-c", "cpu-0"}
    assert snap.nodes["gpu-b"].inventory_source == "inventory"
    assert snap.nodes["gpu-b"].pcie == (("X", "PHB"), ("PHB", "X")) and snap.nodes["gpu-b"].nvlink == ((0, 0), (0, 0))
    assert snap.nodes["gpu-c"].gpu_model == L4 and snap.nodes["gpu-c"].inventory_source == "labels"
    assert set(snap.claims) == {"team-a/one-gpu", "team-a/two-gpus", "team-b/four-gpus"}
    assert snap.claims["team-a/one-gpu"].reserved_for == ("pods/trainer",)  # who holds it: kept
    # A key that a prefix (CUDA_) makes CUDA_MPS_PIPE_DIRECTORY is kept; LOG_LEVEL is not.
    assert snap.config_maps["team-a"]["app-settings"] == frozenset({"MPS_PIPE_DIRECTORY"})
    assert snap.config_maps["team-b"]["limits"] == frozenset({"GPU_CORE_UTILIZATION_POLICY"})
    assert snap.usage == {
        "gpu-a": NodeUsage((whole(81920),) * 4, 16000, 131072, 2),
        "gpu-b": NodeUsage((FREE, FREE), 0, 0, 0),
        "gpu-c": NodeUsage((whole(23034), FREE), 4000, 16384, 1),
        "cpu-0": NodeUsage((), 0, 0, 0),
    }
    assert snap.namespace_usage == {"team-a": Usage(4, 327680, 400), "team-b": Usage(1, 23034, 100)}
    assert snap.quotas["team-b"] == (QuotaLimits("gpu-quota", 4, None, 300),)
    assert snap.quotas["team-c"] == (QuotaLimits("gpu-quota", 1, None, None),)
    assert snap.namespaces["team-c"] == Namespace(
        "team-c", {"kubernetes.io/metadata.name": "team-c", "gpu-admission.io/enabled": "true"}
    )
    assert snap == build_snapshot(mirror.all())

    # Stage 2: the pods watch gets 410 Gone and lists again; infer-0 vanished while we were away.
    run_stage(recorded, reflectors, STAGE_2)
    for kind in KINDS:
        if kind == "pods":
            mirror.listed(kind, "pods.list2.json")
            mirror.streamed(kind, "pods.watch3.jsonl")
        else:
            mirror.streamed(kind, f"{kind}.watch2.jsonl")
    snap = cache.snapshot()
    assert set(snap.nodes) == {"gpu-a", "gpu-b", "gpu-c"}
    assert snap.nodes["gpu-a"].unschedulable is True
    assert snap.nodes["gpu-a"].taints == (Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),)
    assert snap.usage == {
        "gpu-a": NodeUsage((FREE, FREE, whole(81920), whole(81920)), 8000, 65536, 1),
        "gpu-b": NodeUsage((GpuUsage(4096, 25, 1, False), FREE), 1000, 4096, 1),
        "gpu-c": NodeUsage((whole(23034), FREE), 4000, 16384, 1),
    }
    assert snap.namespace_usage == {
        "team-a": Usage(2, 163840, 200),
        "team-b": Usage(1, 23034, 100),
        "team-c": Usage(1, 4096, 25),
    }
    assert "team-c" not in snap.quotas and snap.namespaces["team-b"].managed is False
    assert snap.config_maps == {
        "team-a": {"app-settings": frozenset({"MPS_PIPE_DIRECTORY"})},
        "team-b": {"kube-root-ca.crt": frozenset(), "limits": frozenset()},
    }
    assert set(snap.claims) == {"team-a/one-gpu", "team-a/two-gpus"}
    assert set(snap.claim_templates) == {"team-a/gpu-claim-template", "team-c/eight"}
    assert snap == build_snapshot(mirror.all())

    # Each watch started from its list's resourceVersion, then from the last event or bookmark seen.
    assert recorded.watched_from == {
        "nodes": ["1000", "1012"],
        "gpuinventories": ["1000", "1020"],
        "namespaces": ["1000", "1020"],
        "resourcequotas": ["1000", "1020"],
        "pods": ["1000", "1020", "1040"],
        "resourceclaims": ["1000", "1020"],
        "resourceclaimtemplates": ["1000", "1020"],
        "configmaps": ["1000", "1021"],
    }
    assert reflectors["pods"].lists == 2 and reflectors["nodes"].lists == 1
    assert reflectors["pods"].resource_version == "1050"
    assert cache.counts() == {"nodes": 3, "pods": 3, "namespaces": 4}
    assert cache.errors == 0


def test_snapshot_is_reused_until_something_changes(feed: tuple[ClusterCache, Recorded, dict[str, Reflector]]) -> None:
    cache, recorded, reflectors = feed
    for kind in KINDS:
        reflectors[kind].list_once()
    first = cache.snapshot()
    assert cache.snapshot() is first
    # A node heartbeat changes nothing the core reads: the same snapshot object comes back.
    recorded.streams["nodes"] = ["nodes.watch1.jsonl"]
    heartbeat = json.loads((DATA / "nodes.watch1.jsonl").read_text().splitlines()[0])
    cache.apply("nodes", heartbeat["type"], heartbeat["object"])
    assert cache.snapshot() is first
    # A pod completing changes only usage: nodes and namespaces mappings are shared with the old one.
    done = json.loads((DATA / "pods.watch1.jsonl").read_text().splitlines()[2])
    assert done["object"]["status"]["phase"] == "Succeeded"
    cache.apply("pods", done["type"], done["object"])
    second = cache.snapshot()
    assert second is not first and second.nodes is first.nodes and second.namespaces is first.namespaces
    assert second.usage["gpu-b"] == NodeUsage((FREE, FREE), 0, 0, 0)
    assert first.usage["gpu-b"] == NodeUsage((GpuUsage(8192, 30, 1, False), FREE), 2000, 8192, 1)


def test_counted_follows_the_generation_a_pod_was_seen_at(
    feed: tuple[ClusterCache, Recorded, dict[str, Reflector]],
) -> None:
    cache, _, reflectors = feed
    for kind in KINDS:
        reflectors[kind].list_once()
    _, before = cache.view()
    added = json.loads((DATA / "pods.watch1.jsonl").read_text().splitlines()[1])
    assert added["type"] == "ADDED" and added["object"]["metadata"]["uid"] == "uid-train-1"
    assert cache.counted("uid-train-1", before) is False
    cache.apply("pods", "ADDED", added["object"])
    snap, after = cache.view()
    assert after > before
    assert cache.counted("uid-train-1", before) is False  # the older snapshot does not include it
    assert cache.counted("uid-train-1", after) is True
    cache.apply("pods", "DELETED", added["object"])
    assert cache.counted("uid-train-1", after) is True  # still known, through its tombstone
    assert cache.seen_at("uid-train-1") == 1000.0 and cache.seen_at("uid-nobody") is None


def test_errors_back_off_with_jitter_and_resume_from_the_last_version() -> None:
    cache = ClusterCache(clock=lambda: 0.0)
    calls: list[str] = []
    delays: list[float] = []

    class RecordingStop(threading.Event):
        """Records each back-off instead of sleeping."""

        def wait(self, timeout: float | None = None) -> bool:
            delays.append(timeout or 0.0)
            return False

    stop = RecordingStop()

    class ConnectionReset(Exception):
        status = 500

    def list_fn(kind: str) -> Iterator[Mapping[str, Any]]:
        calls.append("list")
        yield {"metadata": {"resourceVersion": "7"}, "items": []}

    def stream_fn(kind: str, version: str, timeout: int) -> Iterator[Mapping[str, Any]]:
        calls.append(f"watch@{version}")
        if len(calls) <= 3:
            raise ConnectionReset("connection reset by peer")
        if len(calls) == 4:
            yield {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "internal error"}}
        yield {"type": "BOOKMARK", "object": {"kind": "Namespace", "metadata": {"resourceVersion": "9"}}}
        stop.set()

    reflector = Reflector("namespaces", list_fn, stream_fn, cache, backoff=Backoff(initial=1.0, maximum=4.0), stop=stop)
    reflector.run()
    assert calls == ["list", "watch@7", "watch@7", "watch@7", "watch@7"]
    assert reflector.resource_version == "9" and reflector.lists == 1
    assert len(delays) == 3
    assert 0.5 <= delays[0] <= 1.0 and 1.0 <= delays[1] <= 2.0 and 2.0 <= delays[2] <= 4.0


def test_gone_from_the_api_client_lists_again() -> None:
    cache = ClusterCache(clock=lambda: 0.0)
    calls: list[str] = []
    stop = threading.Event()

    class Expired(Exception):
        status = 410

    def list_fn(kind: str) -> Iterator[Mapping[str, Any]]:
        calls.append("list")
        yield {"metadata": {"resourceVersion": str(10 * len(calls))}, "items": []}

    def stream_fn(kind: str, version: str, timeout: int) -> Iterator[Mapping[str, Any]]:
        calls.append(f"watch@{version}")
        if len(calls) == 2:
            raise Expired("Gone")
        stop.set()
        yield from ()

    Reflector("pods", list_fn, stream_fn, cache, stop=stop).run()
    assert calls == ["list", "watch@10", "list", "watch@30"]


def test_staleness_counts_from_the_last_word_of_the_most_silent_watch() -> None:
    now = [100.0]
    cache = ClusterCache(clock=lambda: now[0])
    assert cache.silence() == float("inf")
    for kind in KINDS:
        cache.replace(kind, [])
        cache.heard(kind)
    now[0] = 130.0
    cache.heard("pods")
    now[0] = 190.0
    assert cache.silence() == 90.0
