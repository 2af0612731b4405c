"""A ConfigMap edited right after a GPU pod that reads it through envFrom was admitted, before the watch
shows the pod: a script that creates the pod and at once edits its ConfigMap.

The reservation the validating webhook takes for the pod carries what it reads
(core/admission/configmap_readers.py `env_reads`, the function the watch cache builds
`Snapshot.env_readers` with), and the picture a ConfigMap write is decided against counts those reads
until the watch shows the pod.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
from kubernetes.client.exceptions import ApiException
from ledger_support import FakeConfigMaps
from server_support import cluster_objects, review_answer

from webhook.cluster.cache import KINDS, ClusterCache
from webhook.cluster.reservations import ApiStore, InProcessStore, Ledger, Reservation, ReservationStore
from webhook.cluster.source import LiveSource, with_reservations
from webhook.core.admission.configmap_readers import env_reads
from webhook.core.domain.model import Allocation, EnvReader, TopologyClass
from webhook.core.policy.model import Policy
from webhook.policyfile.holder import PolicyHolder
from webhook.server.app import ServerConfig, create_app
from webhook.server.source import StaticSource

NS = "team-a"
KEY = b"k" * 32
H100 = "NVIDIA-H100-80GB-HBM3"
KIND_OF = {"Node": "nodes", "Namespace": "namespaces", "ResourceQuota": "resourcequotas", "ConfigMap": "configmaps",
           "Pod": "pods"}


def settings(data: dict[str, str], name: str = "settings") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}, "data": data}


BEFORE = settings({"PORT": "80"})
AFTER = settings({"PORT": "80", "VISIBLE_DEVICES": "all"})  # NVIDIA_VISIBLE_DEVICES through the prefix


def gpu_pod(name: str = "train-0", *, prefix: str | None = "NVIDIA_", config_map: str = "settings"
            ) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    if prefix is not None:
        main["envFrom"] = [{"configMapRef": {"name": config_map}, "prefix": prefix}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {"containers": [main]}}


def live_cache(*objects: dict[str, Any]) -> ClusterCache:
    """A synced watch cache over the two-node test cluster, `BEFORE` and `objects`."""
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for obj in [*cluster_objects(), BEFORE, *objects]:
        by_kind[KIND_OF[obj["kind"]]].append(obj)
    cache = ClusterCache()
    for kind in KINDS:
        cache.replace(kind, by_kind[kind])
        cache.heard(kind)
    return cache


def live(cache: ClusterCache, store: ReservationStore | None = None) -> LiveSource:
    return LiveSource(cache, Ledger(store or InProcessStore(), clock=cache.clock))


class Server:
    """The webhook's Flask app over a source, with the real core."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.client = create_app(ServerConfig(source=source, namespace="gpu-admission", record_key=KEY,
                                              policy=PolicyHolder(None, loader=lambda _path: Policy()))).test_client()

    def post(self, endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
        return review_answer(self.client, endpoint, request)

    def create(self, pod: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """The pod through /mutate, then (patched) through /validate, as the API server sends it; returns
        the pod as created."""
        request: dict[str, Any] = {
            "uid": f"r-{pod['metadata']['name']}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": NS,
            "operation": "CREATE", "userInfo": {"username": "alice"}, "object": pod, "dryRun": dry_run}
        mutated = self.post("/mutate", request)
        assert mutated["allowed"], mutated
        patch = json.loads(base64.b64decode(mutated["patch"]))
        created = jsonpatch.apply_patch(copy.deepcopy(pod), patch)
        validated = self.post("/validate", {**request, "object": created})
        assert validated["allowed"], validated
        return created

    def write(self, new: dict[str, Any], old: dict[str, Any] = BEFORE, *, dry_run: bool = False) -> dict[str, Any]:
        return self.post("/validate", {
            "uid": "u-cm", "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"}, "namespace": NS,
            "name": new["metadata"]["name"], "operation": "UPDATE", "userInfo": {"username": "alice"},
            "object": new, "oldObject": old, "dryRun": dry_run})


def refused(answer: dict[str, Any], pod: str = "train-0") -> bool:
    status = answer.get("status", {})
    return (answer["allowed"] is False and status.get("reason") == "isolation-env-configmap"
            and f"GPU pod {NS}/{pod}" in status.get("message", "") and "NVIDIA_VISIBLE_DEVICES" in status["message"])


# --------------------------------------------------------------------------- one replica


def test_an_edit_right_after_the_admission_is_refused_before_and_after_the_watch_shows_the_pod() -> None:
    cache = live_cache()
    source = live(cache)
    server = Server(source)
    assert server.write(AFTER)["allowed"]  # no reader yet
    created = server.create(gpu_pod())
    [entry] = source.ledger.active()
    assert (entry.pod, entry.reads) == ("train-0", frozenset({("settings", "NVIDIA_", "container 'main'")}))
    assert cache.snapshot().env_readers == {}  # the watch has not shown the pod
    assert refused(server.write(AFTER))
    assert refused(server.write(AFTER, dry_run=True))
    assert server.write(settings({"PORT": "81"}))["allowed"]  # keys no prefix makes a variable of
    # The watch shows the pod: the cache counts its reads, the reservation is released, still refused.
    cache.apply("pods", "ADDED", {**created, "spec": {**created["spec"], "nodeName": "gpu-a"},
                                  "status": {"phase": "Pending"}})
    assert refused(server.write(AFTER))
    assert source.prune() == 1 and source.ledger.store.known() == ()
    assert source.snapshot().env_readers[NS]["settings"] == (EnvReader("NVIDIA_", "container 'main'", "train-0", 1),)
    assert refused(server.write(AFTER))
    # Gone: nothing reads it any more.
    cache.apply("pods", "DELETED", created)
    assert server.write(AFTER)["allowed"]


def test_a_dry_run_admission_and_a_pod_without_envfrom_add_no_reads() -> None:
    source = live(live_cache())
    server = Server(source)
    server.create(gpu_pod(), dry_run=True)
    assert source.ledger.active() == ()
    assert server.write(AFTER)["allowed"]
    server.create(gpu_pod("plain", prefix=None))
    [entry] = source.ledger.active()
    assert (entry.uid, entry.pod, entry.reads) == ("uid-plain", "", frozenset())
    assert "envFrom" not in entry.to_json()
    assert source.snapshot().env_readers == {}
    assert server.write(AFTER)["allowed"]


def test_reads_of_reservations_fold_as_the_watch_would_count_the_pods() -> None:
    shown = [gpu_pod("a-0"), gpu_pod("b-0", prefix=""), gpu_pod("c-0", config_map="other")]
    pending = [gpu_pod("a-1"), gpu_pod("0-first"), gpu_pod("d-0", prefix="CUDA_"), gpu_pod("x", prefix="APP_")]
    placed = [{**p, "spec": {**p["spec"], "nodeName": "gpu-a"}, "status": {"phase": "Running"}}
              for p in shown + pending]
    allocation = Allocation("gpu-a", (0,), 1, 81559, 100, "nvidia", H100, TopologyClass.SINGLE, 0.0, "binpack")
    entries = []
    for p in pending:
        _, name, reads = env_reads(p, True)
        entries.append(Reservation(p["metadata"]["uid"], NS, allocation, 1e12, name, reads))
    folded = with_reservations(live_cache(*placed[:len(shown)]).snapshot(), entries)
    assert folded.env_readers == live_cache(*placed).snapshot().env_readers
    assert folded.env_readers[NS]["settings"][-1] == EnvReader("NVIDIA_", "container 'main'", "0-first", 3)
    # No reads among the reservations: the mapping is the base's own.
    base = live_cache(*placed).snapshot()
    assert with_reservations(base, [Reservation("u", NS, allocation, 1e12)]).env_readers is base.env_readers


def test_a_static_source_counts_its_reservations_reads_once() -> None:
    from webhook.cluster.translate import build_snapshot

    source = StaticSource(build_snapshot([*cluster_objects(), BEFORE]))
    server = Server(source)
    assert server.write(AFTER)["allowed"]
    created = server.create(gpu_pod())
    assert refused(server.write(AFTER))
    # The same pod again (a retried call) is not a second reader.
    assert server.post("/validate", {
        "uid": "r-again", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": NS, "operation": "CREATE",
        "userInfo": {"username": "alice"}, "object": created})["allowed"]
    assert source.snapshot().env_readers[NS]["settings"] == (EnvReader("NVIDIA_", "container 'main'", "train-0", 1),)


# --------------------------------------------------------------------------- the shared ledger


def test_the_ledger_json_keeps_the_reads_and_reads_records_without_them() -> None:
    allocation = Allocation("gpu-a", (0,), 1, 81559, 100, "nvidia", H100, TopologyClass.SINGLE, 0.0, "binpack")
    reads = frozenset({("settings", "NVIDIA_", "container 'main'"), ("other", "", "init container 'setup'")})
    entry = Reservation("uid-1", NS, allocation, 12.5, "train-0", reads)
    data = json.loads(json.dumps(entry.to_json()))
    assert data["envFrom"] == {"pod": "train-0", "reads": [["other", "", "init container 'setup'"],
                                                           ["settings", "NVIDIA_", "container 'main'"]]}
    assert Reservation.from_json(NS, data) == entry
    # Every other field is as a replica that predates the reads writes and reads it.
    old = {k: v for k, v in data.items() if k != "envFrom"}
    assert old == Reservation("uid-1", NS, allocation, 12.5).to_json()
    assert Reservation.from_json(NS, old) == Reservation("uid-1", NS, allocation, 12.5)
    # A hand-edited envFrom loses the reads, never the entry (it still counts against quotas).
    for bad in ({"pod": "x"}, {"pod": 1, "reads": []}, {"pod": "x", "reads": [["a", "b"]]}, "reads", []):
        assert Reservation.from_json(NS, {**data, "envFrom": bad}) == Reservation("uid-1", NS, allocation, 12.5)


def api_replica(api: FakeConfigMaps) -> tuple[LiveSource, Server]:
    source = LiveSource(live_cache(), Ledger(ApiStore(api, "gpu-admission")), keep_seconds=210.0)
    return source, Server(source)


def test_two_replicas_sharing_the_ledger_refuse_the_edit_whichever_admitted_the_pod() -> None:
    api = FakeConfigMaps(conflict_rate=0.0)
    (_, server_a), (b, server_b) = api_replica(api), api_replica(api)
    server_b.create(gpu_pod("plain", prefix=None))  # B has read team-a's ledger once, before A's admission
    server_a.create(gpu_pod())
    stored = json.loads(api.objects[("gpu-admission", f"gpu-admission-ledger-{NS}")][1]["reservations"])
    assert [e.get("envFrom") for e in stored] == [None, {"pod": "train-0",
                                                         "reads": [["settings", "NVIDIA_", "container 'main'"]]}]
    assert [e.uid for e in b.ledger.active()] == ["uid-plain"]  # what B knew before the write came
    assert refused(server_b.write(AFTER))  # B reads the ledger again first
    assert refused(server_a.write(AFTER))
    # Read again unchanged, the ledger leaves the snapshot built on it as it was.
    view = b.snapshot()
    assert refused(server_b.write(AFTER)) and b.snapshot() is view
    # A third replica started after the admission reads the reads from the ledger.
    c, server_c = api_replica(api)
    assert refused(server_c.write(AFTER))
    assert {e.uid: e.reads != frozenset() for e in c.ledger.active()} == {"uid-plain": False, "uid-train-0": True}


def test_an_unreadable_shared_ledger_leaves_the_write_to_what_the_replica_knows() -> None:
    api = FakeConfigMaps(conflict_rate=0.0)
    source, server = api_replica(api)
    server.create(gpu_pod())

    def broken(name: str, namespace: str) -> Any:
        raise ApiException(status=500, reason="Internal Server Error")

    api.read_namespaced_config_map = broken  # type: ignore[method-assign]
    assert refused(server.write(AFTER))  # its own reservation is known
    assert server.write(settings({"PORT": "81"}))["allowed"]
