"""The kubernetes-client boundary (list pages, watch streams, `snapshot`) against a local HTTP stub that
serves the recorded JSON of tests/data/watch/; no API server runs."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from webhook.cluster.cache import KINDS, ClusterCache
from webhook.cluster.config import load_api_client
from webhook.cluster.files import load_cluster
from webhook.cluster.kube import KubeLister
from webhook.cluster.translate import build_snapshot
from webhook.cluster.watch import Reflector
from webhook.commands import snapshot as snapshot_command
from webhook.errors import UserError

DATA = Path(__file__).parent.parent / "data" / "watch"
PATHS = {
    "/api/v1/nodes": "nodes",
    "/api/v1/pods": "pods",
    "/api/v1/namespaces": "namespaces",
    "/api/v1/resourcequotas": "resourcequotas",
    "/api/v1/configmaps": "configmaps",
    "/apis/gpu-admission.io/v1alpha1/gpuinventories": "gpuinventories",
    "/apis/resource.k8s.io/v1/resourceclaims": "resourceclaims",
    "/apis/resource.k8s.io/v1/resourceclaimtemplates": "resourceclaimtemplates",
}


class Stub(BaseHTTPRequestHandler):
    """Lists in pages of `limit` (the continue token is the next offset), streams the recorded watch."""

    requests: list[tuple[str, dict[str, str]]] = []
    without: set[str] = set()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        Stub.requests.append((url.path, query))
        kind = PATHS.get(url.path)
        if kind is None or kind in Stub.without:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
            self._send(404, json.dumps(body).encode())
            return
        if query.get("watch") == "true":
            self._send(200, (DATA / f"{kind}.watch1.jsonl").read_bytes())
            return
        listed = json.loads((DATA / f"{kind}.list1.json").read_text())
        start = int(query.get("continue", "0"))
        limit = int(query.get("limit", "500"))
        items = listed["items"][start : start + limit]
        more = start + limit < len(listed["items"])
        listed["items"] = items
        if more:
            listed["metadata"]["continue"] = str(start + limit)
        self._send(200, json.dumps(listed).encode())

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def kubeconfig(tmp_path: Path) -> Iterator[str]:
    Stub.requests = []
    Stub.without = set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stub", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "me", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "me"}}],
                "current-context": "stub",
            }
        )
    )
    yield str(path)
    server.shutdown()
    server.server_close()


def test_lists_page_by_page_and_adds_the_kind_the_items_lack(kubeconfig: str) -> None:
    lister = KubeLister(load_api_client(kubeconfig), page_size=2)
    pages = list(lister.list_pages("nodes"))
    assert [[i["metadata"]["name"] for i in p["items"]] for p in pages] == [["gpu-a", "gpu-b"], ["cpu-0"]]
    assert {(i["apiVersion"], i["kind"]) for p in pages for i in p["items"]} == {("v1", "Node")}
    assert [(path, q.get("limit"), q.get("continue")) for path, q in Stub.requests] == [
        ("/api/v1/nodes", "2", None),
        ("/api/v1/nodes", "2", "2"),
    ]


def test_watch_streams_the_events_as_sent_from_the_given_version(kubeconfig: str) -> None:
    lister = KubeLister(load_api_client(kubeconfig))
    events = list(lister.stream("pods", "1000", 30))
    recorded = [json.loads(line) for line in (DATA / "pods.watch1.jsonl").read_text().splitlines()]
    assert events == recorded
    path, query = Stub.requests[0]
    assert path == "/api/v1/pods"
    assert {k: query[k] for k in ("watch", "resourceVersion", "allowWatchBookmarks", "timeoutSeconds")} == {
        "watch": "true",
        "resourceVersion": "1000",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "30",
    }


def test_reflector_over_http_fills_the_cache(kubeconfig: str) -> None:
    lister = KubeLister(load_api_client(kubeconfig))
    cache = ClusterCache(clock=lambda: 0.0)
    stop = threading.Event()

    def one_stream(kind: str, version: str, timeout: int) -> Iterator[Any]:
        yield from lister.stream(kind, version, timeout)
        stop.set()

    for kind in KINDS:
        stop.clear()
        Reflector(kind, lister.list_pages, one_stream, cache, stop=stop).run()
    assert cache.synced()
    snap = cache.snapshot()
    assert sorted(snap.nodes) == ["cpu-0", "gpu-a", "gpu-b", "gpu-c"]
    assert snap.namespace_usage["team-a"].gpus == 4
    assert set(snap.claims) == {"team-a/one-gpu", "team-a/two-gpus", "team-b/four-gpus"}
    assert set(snap.claim_templates) == {"team-a/gpu-claim-template"}
    assert snap.config_maps["team-a"]["gpu-escape"] == frozenset({"NVIDIA_VISIBLE_DEVICES"})


def test_snapshot_command_writes_what_check_reads(kubeconfig: str, tmp_path: Path) -> None:
    out = tmp_path / "cluster.yaml"
    args = argparse.Namespace(kubeconfig=kubeconfig, context=None, output=str(out))
    assert snapshot_command.run(args) == 0
    document = yaml.safe_load(out.read_text())
    assert (document["apiVersion"], document["kind"]) == ("v1", "List")
    assert [o["kind"] for o in document["items"]].count("Pod") == 4
    assert all("managedFields" not in o["metadata"] for o in document["items"])
    listed = [
        {"kind": kind, **item}
        for kind, plural in [
            ("Node", "nodes"),
            ("Pod", "pods"),
            ("Namespace", "namespaces"),
            ("ResourceQuota", "resourcequotas"),
            ("GPUInventory", "gpuinventories"),
            ("ResourceClaim", "resourceclaims"),
            ("ResourceClaimTemplate", "resourceclaimtemplates"),
            ("ConfigMap", "configmaps"),
        ]
        for item in json.loads((DATA / f"{plural}.list1.json").read_text())["items"]
    ]
    assert build_snapshot(load_cluster([str(out)])) == build_snapshot(listed)
    # ConfigMaps leave the cluster with only the keys the webhook reads, values blanked.
    maps = {o["metadata"]["name"]: o for o in document["items"] if o["kind"] == "ConfigMap"}
    assert maps["gpu-escape"]["data"] == {"NVIDIA_VISIBLE_DEVICES": ""} and maps["app-settings"]["data"] == {}


def test_a_cluster_without_the_inventory_crd_has_no_inventories(kubeconfig: str) -> None:
    Stub.without = {"gpuinventories"}
    objects = snapshot_command.live_objects(kubeconfig)
    assert "GPUInventory" not in {o["kind"] for o in objects} and len(objects) == 19  # 3 ConfigMaps


def test_a_refusing_api_server_is_one_line(kubeconfig: str) -> None:
    Stub.without = {"pods"}
    with pytest.raises(UserError, match=r"^http://127\.0\.0\.1:\d+: cannot list pods: HTTP 404 Not Found$"):
        snapshot_command.live_objects(kubeconfig)


def test_build_source_watches_until_synced_and_ready(kubeconfig: str) -> None:
    import time

    from webhook.cluster.source import build_source

    source = build_source(kubeconfig=kubeconfig, namespace="gpu-admission", freeze_gc=False)
    try:
        deadline = time.monotonic() + 20
        while not source.ready()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        ready, reason = source.ready()
        assert ready, reason
        assert reason.startswith("watch cache synced: ")
        assert source.snapshot().nodes.keys() >= {"gpu-a", "gpu-b", "cpu-0"}
    finally:
        source.close()
    assert source.upkeep is not None and not any(t.is_alive() for t in source.upkeep.threads)


def test_build_source_names_a_wrong_reservations_store(kubeconfig: str) -> None:
    from webhook.cluster.source import build_source

    with pytest.raises(UserError, match="^reservations must be memory, api or leader, got 'etcd'$"):
        build_source(kubeconfig=kubeconfig, reservations="etcd", start=False)


def test_a_missing_inventory_crd_lists_empty_and_is_looked_for_again(kubeconfig: str) -> None:
    from webhook.cluster.watch import Gone

    Stub.without = {"gpuinventories"}
    lister = KubeLister(load_api_client(kubeconfig), absent_recheck=0.0)
    assert list(lister.list_pages("gpuinventories")) == [{"metadata": {"resourceVersion": ""}, "items": []}]
    with pytest.raises(Gone, match="^the GPUInventory CRD is not installed$"):
        list(lister.stream("gpuinventories", "", 30))
    cache = ClusterCache(clock=lambda: 0.0)
    reflector = Reflector("gpuinventories", lister.list_pages, lister.stream, cache)
    reflector.list_once()
    assert cache.unsynced() == ["nodes", "namespaces", "resourcequotas", "pods", "resourceclaims",
                                "resourceclaimtemplates", "configmaps"]


def test_a_cluster_before_kubernetes_1_34_has_no_dra_claims_and_still_syncs(kubeconfig: str) -> None:
    from webhook.cluster.watch import Gone

    Stub.without = {"resourceclaims", "resourceclaimtemplates"}
    lister = KubeLister(load_api_client(kubeconfig), absent_recheck=0.0)
    with pytest.raises(Gone, match=r"^resource\.k8s\.io/v1 resourceclaims are not served"):
        list(lister.stream("resourceclaims", "", 30))
    cache = ClusterCache(clock=lambda: 0.0)
    for kind in ("resourceclaims", "resourceclaimtemplates"):
        Reflector(kind, lister.list_pages, lister.stream, cache).list_once()
    assert "resourceclaims" not in cache.unsynced() and cache.snapshot().claims == {}
    objects = snapshot_command.live_objects(kubeconfig)
    assert not {"ResourceClaim", "ResourceClaimTemplate"} & {o["kind"] for o in objects}
