"""Host CPU and memory in decisions: the record carries them, the ledger and `check` count them on the
chosen node, so a node whose CPU earlier decisions took is not offered again for GPU work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from webhook.cli import main
from webhook.cluster.cache import KINDS, ClusterCache
from webhook.cluster.reservations import Reservation
from webhook.cluster.source import LiveSource, with_reservations
from webhook.core.admission import admit
from webhook.core.domain.model import Allocation, TopologyClass
from webhook.core.placement.state import with_allocation
from webhook.core.podspec.record import allocation_from_json, allocation_to_json, read_sealed, sealed_text
from webhook.core.policy.model import Policy

L4 = "NVIDIA-L4"


def gpu_node(name: str, gpus: int, cpu: str, memory: str = "256Gi") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": L4, "nvidia.com/gpu.memory": "23034",
                                              "nvidia.com/gpu.count": str(gpus)}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)}},
    }


MANAGED = {"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": "ml", "labels": {"gpu-admission.io/enabled": "true"}}}


def pod(name: str, gpus: int, cpu: str, memory: str = "1Gi", init_cpu: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{
        "name": "main", "image": "cuda",
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"cpu": cpu, "memory": memory}},
    }]}
    if init_cpu:
        spec["initContainers"] = [{"name": "prep", "image": "busybox", "resources": {"requests": {"cpu": init_cpu}}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def run_check(tmp_path: Path, capsys: pytest.CaptureFixture[str], nodes: list[dict[str, Any]],
              pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [*nodes, MANAGED]}))
    manifest = tmp_path / "pods.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    main(["check", "--cluster", str(cluster), str(manifest), "-o", "json"])
    results: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["results"]
    return results


def test_check_does_not_place_gpu_work_where_earlier_pods_took_the_cpu(tmp_path: Path, capsys) -> None:
    # 8 GPUs, 16 CPUs: the first 1-GPU pod takes 12 CPUs; 7 GPUs stay free but only 4 CPUs.
    results = run_check(tmp_path, capsys, [gpu_node("gpu-1", 8, "16")],
                        [pod("first", 1, "12"), pod("second", 1, "12")])
    first, second = results
    assert first["allowed"] and first["allocation"]["node"] == "gpu-1"
    assert first["allocation"]["cpuMilli"] == 12000
    assert second["allocation"]["node"] is None  # waits: no node has 12 free CPUs now
    assert any("no GPU free now" in w for w in second["warnings"])


def test_check_sends_the_second_pod_to_the_node_with_cpu_left(tmp_path: Path, capsys) -> None:
    nodes = [gpu_node("gpu-a", 8, "16"), gpu_node("gpu-b", 8, "16")]
    results = run_check(tmp_path, capsys, nodes, [pod("first", 1, "12"), pod("second", 1, "12"), pod("small", 1, "4")])
    placed = [r["allocation"]["node"] for r in results]
    assert placed[0] != placed[1] and set(placed[:2]) == {"gpu-a", "gpu-b"}
    assert placed[2] in ("gpu-a", "gpu-b")  # 4 CPUs still fit beside either 12
    # A fourth 12-CPU pod has nowhere to go: both nodes' CPU is taken, though 13 GPUs are free.
    results = run_check(tmp_path, capsys, nodes, [pod(f"p{i}", 1, "12") for i in range(3)])
    assert [r["allocation"]["node"] is None for r in results] == [False, False, True]


def test_host_memory_counts_too(tmp_path: Path, capsys) -> None:
    results = run_check(tmp_path, capsys, [gpu_node("gpu-1", 8, "64", memory="64Gi")],
                        [pod("first", 1, "1", memory="40Gi"), pod("second", 1, "1", memory="40Gi")])
    assert results[0]["allocation"]["hostMemoryMiB"] == 40 * 1024
    assert results[1]["allocation"]["node"] is None


def test_init_containers_count_as_kubernetes_counts_them(tmp_path: Path, capsys) -> None:
    # max(app containers together, largest init container): 14 CPUs for the first, so 2 are left.
    results = run_check(tmp_path, capsys, [gpu_node("gpu-1", 8, "16")],
                        [pod("first", 1, "2", init_cpu="14"), pod("second", 1, "3")])
    assert results[0]["allocation"]["cpuMilli"] == 14000
    assert results[1]["allocation"]["node"] is None


def test_mutate_records_the_pods_host_requests() -> None:
    from webhook.cluster.translate import build_snapshot

    snapshot = build_snapshot([gpu_node("gpu-1", 2, "32"), MANAGED])
    decision = admit.mutate(pod("p", 1, "1500m", memory="3Gi"), snapshot, Policy())
    assert decision.allowed and decision.allocation is not None
    assert (decision.allocation.cpu_milli, decision.allocation.host_memory_mib) == (1500, 3072)


# -- the record -------------------------------------------------------------------------------------


def allocation(cpu: int = 0, memory: int = 0, node: str | None = "n1", gpus: tuple[int, ...] = (0,)) -> Allocation:
    return Allocation(node, gpus, len(gpus), 23034, 100, "nvidia", L4, TopologyClass.SINGLE, 0.0, "binpack",
                      cpu_milli=cpu, host_memory_mib=memory)


def test_record_round_trip_keeps_host_resources() -> None:
    with_host = allocation(12000, 4096)
    record = allocation_to_json(with_host)
    assert (record["cpuMilli"], record["hostMemoryMiB"]) == (12000, 4096)
    assert allocation_from_json(json.loads(json.dumps(record))) == with_host
    sealed = read_sealed(sealed_text(with_host, None, "ml|c0=nvidia:1", b"k"), "ml|c0=nvidia:1", b"k")
    assert not isinstance(sealed, str) and sealed.allocation == with_host


def test_a_record_without_host_requests_is_unchanged() -> None:
    record = allocation_to_json(allocation())
    assert "cpuMilli" not in record and "hostMemoryMiB" not in record
    assert allocation_from_json(record) == allocation()


@pytest.mark.parametrize("bad", [-1, "12", 1.5, True])
def test_a_bad_host_figure_in_a_record_is_named(bad: object) -> None:
    record = {**allocation_to_json(allocation()), "cpuMilli": bad}
    with pytest.raises(ValueError, match="cpuMilli"):
        allocation_from_json(record)


# -- the ledger -------------------------------------------------------------------------------------


def cache_with(nodes: list[dict[str, Any]]) -> ClusterCache:
    cache = ClusterCache(clock=lambda: 0.0)
    cache.replace("nodes", nodes)
    cache.replace("namespaces", [MANAGED])
    for kind in KINDS:
        if kind not in ("nodes", "namespaces"):
            cache.replace(kind, [])
        cache.heard(kind)
    return cache


def test_a_reservation_counts_its_cpu_and_memory_on_its_node() -> None:
    base = cache_with([gpu_node("gpu-1", 8, "16")]).snapshot()
    entry = Reservation("uid-1", "ml", allocation(12000, 2048, "gpu-1"), 10.0)
    counted = with_reservations(base, [entry])
    assert (counted.usage["gpu-1"].cpu_milli, counted.usage["gpu-1"].memory_mib) == (12000, 2048)
    assert counted.usage == with_allocation(base, "ml", entry.allocation).usage


def test_the_live_source_does_not_offer_a_node_whose_cpu_a_reservation_holds() -> None:
    source = LiveSource(cache_with([gpu_node("gpu-1", 8, "16")]))
    decide = lambda snapshot: admit.mutate(pod("p", 1, "12"), snapshot, Policy())  # noqa: E731
    first = source.commit("uid-1", "ml", decide, dry_run=False)
    assert first.allowed and first.allocation is not None and first.allocation.node == "gpu-1"
    assert source.snapshot().usage["gpu-1"].cpu_milli == 12000
    second = admit.mutate(pod("q", 1, "12"), source.snapshot(), Policy())
    assert second.allocation is not None and second.allocation.node is None


def test_running_gpu_pods_from_the_watch_count_their_cpu() -> None:
    cache = cache_with([gpu_node("gpu-1", 8, "16")])
    running = pod("running", 1, "12")
    running["metadata"]["uid"] = "uid-r"
    running["spec"]["nodeName"] = "gpu-1"
    running["status"] = {"phase": "Running"}
    cache.replace("pods", [running])
    assert cache.snapshot().usage["gpu-1"].cpu_milli == 12000
    decision = admit.mutate(pod("q", 1, "12"), cache.snapshot(), Policy())
    assert decision.allocation is not None and decision.allocation.node is None


def test_a_pod_asking_no_cpu_records_none(tmp_path: Path, capsys) -> None:
    """The usual record of a pod without host requests is unchanged."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [gpu_node("gpu-1", 2, "8"), MANAGED]}))
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    manifest = tmp_path / "p.json"
    manifest.write_text(json.dumps(bare))
    main(["check", "--cluster", str(cluster), str(manifest), "-o", "json"])
    record = json.loads(capsys.readouterr().out)["results"][0]["allocation"]
    assert "cpuMilli" not in record and record["node"] == "gpu-1"
