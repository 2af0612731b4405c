"""Kubernetes objects -> core model: inventories, GFD labels, quotas, running pods, the snapshot."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from webhook.cluster.translate import (
    PodUsage,
    build_snapshot,
    inventory_of,
    is_cluster_kind,
    namespace_of,
    node_of,
    pod_usage_of,
    quotas_of,
)
from webhook.core.domain.model import Gpu, GpuUsage, Namespace, NodeUsage, QuotaLimits, Taint, Usage


def inventory_spec(n: int = 2, links: int = 18) -> dict[str, Any]:
    return {
        "version": 1,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{i}",
                "model": "NVIDIA-H100-80GB-HBM3",
                "memoryMiB": 81559,
                "numa": i // 4,
                "healthy": True,
            }
            for i in range(n)
        ],
        "nvlink": [[0 if i == j else links for j in range(n)] for i in range(n)],
        "pcie": [["X" if i == j else "NODE" for j in range(n)] for i in range(n)],
    }


def node_obj(
    name: str = "n1",
    labels: dict[str, str] | None = None,
    allocatable: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
        "status": {"allocatable": allocatable or {"cpu": "8", "memory": "32Gi"}},
    }


def inventory_obj(name: str = "n1", n: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "gpu-admission.io/v1alpha1",
        "kind": "GPUInventory",
        "metadata": {"name": name},
        "spec": inventory_spec(n),
    }


def pod_obj(
    name: str,
    namespace: str = "team-a",
    node: str | None = "n1",
    limits: dict[str, Any] | None = None,
    allocation: dict[str, Any] | None = None,
    phase: str = "Running",
    cpu: str = "1",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if allocation is not None:
        metadata["annotations"] = {"gpu-admission.io/allocation": json.dumps(allocation)}
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"limits": limits or {}, "requests": {"cpu": cpu, "memory": "1Gi"}}}]
    }
    if env:
        spec["containers"][0]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": metadata, "spec": spec, "status": {"phase": phase}}


def allocation(node: str | None, gpus: list[int], count: int, memory: int, cores: int) -> dict[str, Any]:
    return {
        "version": 1,
        "node": node,
        "gpus": gpus,
        "uuids": [],
        "gpuCount": count,
        "memoryMiB": memory,
        "cores": cores,
        "vendor": "nvidia",
        "model": "NVIDIA-H100-80GB-HBM3",
        "topology": "single",
        "loss": 0.0,
        "policy": "binpack",
    }


# --- inventory --------------------------------------------------------------------------------


def test_inventory_of() -> None:
    gpus, nvlink, pcie = inventory_of(inventory_spec(2))
    assert gpus == (
        Gpu(0, "GPU-0", "NVIDIA-H100-80GB-HBM3", 81559, 0, True),
        Gpu(1, "GPU-1", "NVIDIA-H100-80GB-HBM3", 81559, 0, True),
    )
    assert nvlink == ((0, 18), (18, 0))
    assert pcie == (("X", "NODE"), ("NODE", "X"))


def _broken(change: Any) -> dict[str, Any]:
    spec = inventory_spec(8)
    change(spec)
    return spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_broken(lambda s: s["nvlink"][2].pop()), "spec.nvlink[2]: must have one entry per GPU (8), got 7"),
        (_broken(lambda s: s.update(version=2)), "spec.version: must be 1, got 2"),
        (_broken(lambda s: s.pop("gpus")), "spec.gpus: required"),
        (_broken(lambda s: s["gpus"][3].pop("memoryMiB")), "spec.gpus[3].memoryMiB: required"),
        (
            _broken(lambda s: s["gpus"][1].update(healthy="yes")),
            "spec.gpus[1].healthy: must be true or false, got 'yes'",
        ),
        (_broken(lambda s: s["pcie"][0].__setitem__(0, "PIX")), "spec.pcie[0][0]: must be X, got 'PIX'"),
        (
            _broken(lambda s: s["pcie"][0].__setitem__(1, "FAST")),
            "spec.pcie[0][1]: must be one of X, PIX, PXB, PHB, NODE, SYS, got 'FAST'",
        ),
        (
            _broken(lambda s: s["nvlink"][1].__setitem__(0, 4)),
            "spec.nvlink[1][0]: must equal spec.nvlink[0][1] (18), got 4",
        ),
        (_broken(lambda s: s["nvlink"].pop()), "spec.nvlink: must have one row per GPU (8), got 7"),
        ("not an object", "spec: must be an object, got a string"),
    ],
)
def test_bad_inventory_names_the_field(spec: Any, message: str) -> None:
    with pytest.raises(ValueError) as err:
        inventory_of(spec)
    assert str(err.value) == message


# --- nodes ------------------------------------------------------------------------------------


def test_node_from_gpu_inventory() -> None:
    node = node_of(
        node_obj(labels={"nvidia.com/gpu.clique": "c1"}, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        inventory_obj(n=4),
    )
    assert (node.name, node.inventory_source, node.vendor, len(node.gpus), node.gpu_model) == (
        "n1",
        "inventory",
        "nvidia",
        4,
        "NVIDIA-H100-80GB-HBM3",
    )
    assert node.nvlink[0] == (0, 18, 18, 18)
    assert (node.cpu_milli, node.memory_mib, node.clique) == (8000, 32768, "c1")
    assert node.taints == (Taint("nvidia.com/gpu", "", "NoSchedule"),)
    assert not node.unschedulable


def test_node_from_annotation() -> None:
    node = node_of(
        node_obj(
            annotations={"gpu-admission.io/inventory": json.dumps(inventory_spec(2, links=4))},
            unschedulable=True,
        )
    )
    assert (node.inventory_source, node.nvlink, node.unschedulable) == ("annotation", ((0, 4), (4, 0)), True)


def test_bad_annotation_names_it() -> None:
    with pytest.raises(ValueError) as err:
        node_of(node_obj(annotations={"gpu-admission.io/inventory": "{nope"}))
    assert str(err.value).startswith("metadata.annotations[gpu-admission.io/inventory]: not valid JSON (")
    broken = inventory_spec(2)
    broken["gpus"][0]["numa"] = -1
    with pytest.raises(ValueError) as err:
        node_of(node_obj(annotations={"gpu-admission.io/inventory": json.dumps(broken)}))
    assert str(err.value) == "metadata.annotations[gpu-admission.io/inventory].gpus[0].numa: must be at least 0, got -1"


GFD = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.count": "4"}


def test_node_from_feature_discovery_labels() -> None:
    node = node_of(
        node_obj("l4", labels=GFD, allocatable={"cpu": "47500m", "memory": "196565668Ki", "nvidia.com/gpu": "4"})
    )
    assert node.inventory_source == "labels"
    assert node.gpus == tuple(Gpu(i, f"l4-gpu-{i}", "NVIDIA-L4", 23034) for i in range(4))
    assert node.nvlink == ((0,) * 4,) * 4
    assert node.pcie[1] == ("SYS", "X", "SYS", "SYS")
    assert (node.cpu_milli, node.memory_mib) == (47500, 191958)


def test_feature_discovery_counts() -> None:
    unhealthy = node_of(node_obj(labels=GFD, allocatable={"nvidia.com/gpu": "3"}))
    assert len(unhealthy.gpus) == 3  # the device plugin withdrew a card
    sliced = node_of(
        node_obj(
            labels={
                **GFD,
                "nvidia.com/gpu.product": "Tesla-T4-SHARED",
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
            },
            allocatable={"nvidia.com/gpu": "40"},
        )
    )
    assert (len(sliced.gpus), sliced.gpu_model) == (4, "Tesla-T4")
    replicas_only = node_of(
        node_obj(
            labels={"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.product": "Tesla-T4"},
            allocatable={"nvidia.com/gpu": "8"},
        )
    )
    assert len(replicas_only.gpus) == 2
    plugin_only = node_of(node_obj(allocatable={"nvidia.com/gpu": "2"}))
    assert [(g.model, g.memory_mib) for g in plugin_only.gpus] == [("unknown", 0), ("unknown", 0)]


def test_bad_label_names_it() -> None:
    with pytest.raises(ValueError) as err:
        node_of(node_obj(labels={**GFD, "nvidia.com/gpu.count": "four"}))
    assert str(err.value) == "metadata.labels[nvidia.com/gpu.count]: 'four' is not a Kubernetes quantity"


def test_other_vendors_by_allocatable() -> None:
    hygon = node_of(
        node_obj(allocatable={"hygon.com/dcunum": "8", "hygon.com/dcucores": "400", "hygon.com/dcumem": "262144"})
    )
    assert (hygon.vendor, len(hygon.gpus), hygon.gpus[0].memory_mib, hygon.gpu_model) == (
        "hygon",
        4,
        65536,
        "DCU",
    )
    mlu = node_of(
        node_obj(
            allocatable={
                "cambricon.com/vmlu": "4",
                "cambricon.com/mlu370.smlu.vcore": "200",
                "cambricon.com/mlu370.smlu.vmemory": "192",
            }
        )
    )
    assert (mlu.vendor, len(mlu.gpus), mlu.gpus[0].memory_mib, mlu.gpu_model) == (
        "cambricon",
        2,
        24576,
        "MLU370",
    )


def test_cpu_only_node() -> None:
    node = node_of(node_obj())
    assert (node.gpus, node.inventory_source) == ((), "none")


def test_bad_taint() -> None:
    with pytest.raises(ValueError) as err:
        node_of(node_obj(taints=["nope"]))
    assert str(err.value) == "spec.taints[0]: expected a mapping with a key"


# --- namespaces and quotas --------------------------------------------------------------------


def test_namespace_of() -> None:
    ns = namespace_of(
        {"kind": "Namespace", "metadata": {"name": "team-a", "labels": {"gpu-admission.io/enabled": "true"}}}
    )
    assert ns == Namespace("team-a", {"gpu-admission.io/enabled": "true"}) and ns.managed


def test_quotas_of() -> None:
    quota = quotas_of(
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": "a"},
            "spec": {
                "hard": {
                    "requests.nvidia.com/gpu": "8",
                    "limits.nvidia.com/gpumem": "1e5",
                    "limits.nvidia.com/gpucores": 400,
                    "nvidia.com/gpu": 6,
                    "requests.cpu": "100",
                }
            },
        }
    )
    assert quota == QuotaLimits("gpu", 6, 100000, 400)
    assert quotas_of({"metadata": {"name": "q"}, "spec": {}}) == QuotaLimits("q")


def test_bad_quota_names_the_key() -> None:
    with pytest.raises(ValueError) as err:
        quotas_of({"metadata": {"name": "q"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "1.5"}}})
    assert str(err.value) == "spec.hard[limits.nvidia.com/gpumem]: expected a whole number >= 0, got '1.5'"


# --- pods -------------------------------------------------------------------------------------


def test_pod_usage_from_limits_and_annotation_indices() -> None:
    limits = {"CUDA_DEVICE_MEMORY_LIMIT_0": "4000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "4000m",
              "CUDA_DEVICE_SM_LIMIT": "30"}
    recorded = allocation("n1", [2, 3], 2, 4000, 30)
    use = pod_usage_of(pod_obj("p", limits={"nvidia.com/gpu": 2}, allocation=recorded, env=limits))
    assert use == PodUsage("team-a", "n1", (2, 3), 2, 4000, None, 30, 1000, 1024, "nvidia")


def test_pod_usage_from_resources() -> None:
    whole = pod_usage_of(pod_obj("p", limits={"nvidia.com/gpu": 2}))
    assert whole == PodUsage("team-a", "n1", None, 2, None, None, 100, 1000, 1024, "nvidia")
    assert whole is not None and whole.exclusive and whole.memory_on(81559) == 81559
    slice_ = pod_usage_of(pod_obj("p", limits={"nvidia.com/gpumem-percentage": 25}))
    assert slice_ == PodUsage("team-a", "n1", None, 1, None, 25, 0, 1000, 1024, "nvidia")
    assert slice_ is not None and not slice_.exclusive and slice_.memory_on(80000) == 20000


def test_pods_that_use_nothing() -> None:
    assert pod_usage_of(pod_obj("p", limits={"nvidia.com/gpu": 1}, phase="Succeeded")) is None
    assert pod_usage_of(pod_obj("p", limits={"nvidia.com/gpu": 1}, phase="Failed")) is None
    assert pod_usage_of(pod_obj("p")) is None


def test_unreadable_annotation_falls_back_to_resources() -> None:
    pod = pod_obj("p", limits={"nvidia.com/gpu": 1})
    pod["metadata"]["annotations"] = {"gpu-admission.io/allocation": "{broken"}
    assert pod_usage_of(pod) == PodUsage("team-a", "n1", None, 1, None, None, 100, 1000, 1024, "nvidia")


def test_annotation_for_another_node_drops_the_indices() -> None:
    one = {"nvidia.com/gpu": 1}
    moved = pod_usage_of(pod_obj("p", node="n2", limits=one, allocation=allocation("n1", [0], 1, 1000, 10)))
    assert moved is not None and (moved.node, moved.gpus) == ("n2", None)
    pending = pod_usage_of(pod_obj("p", node=None, limits=one, allocation=allocation(None, [], 1, 1000, 10)))
    assert pending is not None and (pending.node, pending.gpus) == (None, None)


# --- snapshot ---------------------------------------------------------------------------------


def cluster() -> list[dict[str, Any]]:
    return [
        node_obj("n1"),
        inventory_obj("n1", 4),
        node_obj("n2", labels=GFD, allocatable={"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}),
        node_obj("cpu"),
        {"kind": "Namespace", "metadata": {"name": "team-a", "labels": {"gpu-admission.io/enabled": "true"}}},
        {"kind": "Namespace", "metadata": {"name": "sandbox"}},
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": "team-a"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "8"}},
        },
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "cores", "namespace": "team-a"},
            "spec": {"hard": {"limits.nvidia.com/gpucores": "300"}},
        },
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "cpu", "namespace": "team-a"},
            "spec": {"hard": {"cpu": "9"}},
        },
        {"kind": "Service", "metadata": {"name": "ignored"}},
        pod_obj("recorded", limits={"nvidia.com/gpu": 1}, allocation=allocation("n1", [1], 1, 20000, 50),
                env={"CUDA_DEVICE_MEMORY_LIMIT_0": "20000m", "CUDA_DEVICE_SM_LIMIT": "50"}),
        pod_obj("plain", limits={"nvidia.com/gpu": 2}),
        pod_obj("shared", node="n2", limits={"nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 20}),
        pod_obj("done", limits={"nvidia.com/gpu": 4}, phase="Succeeded"),
        pod_obj("pending", node=None, limits={"nvidia.com/gpu": 1}),
        pod_obj("web", node="cpu", cpu="500m"),
        pod_obj("elsewhere", namespace="sandbox", node="gone", limits={"nvidia.com/gpu": 1}),
    ]


def test_build_snapshot() -> None:
    snap = build_snapshot(cluster())
    assert list(snap.nodes) == ["n1", "n2", "cpu"]
    assert [snap.nodes[n].inventory_source for n in snap.nodes] == ["inventory", "labels", "none"]
    # "recorded" holds GPU 1; "plain" takes the two least-used GPUs, 0 and 2.
    assert snap.usage["n1"] == NodeUsage(
        (
            GpuUsage(81559, 100, 1, True),
            GpuUsage(20000, 50, 1, False),
            GpuUsage(81559, 100, 1, True),
            GpuUsage(),
        ),
        2000,
        2048,
        2,
    )
    assert snap.usage["n2"] == NodeUsage(
        (GpuUsage(3000, 20, 1, False), GpuUsage(), GpuUsage(), GpuUsage()), 1000, 1024, 1
    )
    assert snap.usage["cpu"] == NodeUsage((), 500, 1024, 0)
    assert snap.namespaces == {
        "team-a": Namespace("team-a", {"gpu-admission.io/enabled": "true"}),
        "sandbox": Namespace("sandbox", {}),
    }
    assert snap.quotas == {"team-a": (QuotaLimits("cores", cores=300), QuotaLimits("gpu", gpus=8))}
    # team-a: recorded 1 x 20000 MiB x 50 %, plain 2 whole H100s, shared 3000 MiB x 20 %, pending 1 GPU whose
    # card is unknown yet (memory 0). sandbox's pod runs on a node the snapshot does not know: quota only.
    assert snap.namespace_usage == {
        "team-a": Usage(5, 20000 + 2 * 81559 + 3000, 50 + 200 + 20 + 100),
        "sandbox": Usage(1, 0, 100),
    }


def test_snapshot_does_not_depend_on_pod_order() -> None:
    objects = cluster() + [pod_obj(f"s{i}", node="n2", limits={"nvidia.com/gpumem": 1000 * (i + 1)}) for i in range(6)]
    reordered = objects[:10] + list(reversed(objects[10:]))
    assert build_snapshot(reordered).usage == build_snapshot(objects).usage
    # s0..s5 take the least-used GPU in name order (1000, 2000, 3000, 4000 MiB, then 5000 on GPU 0 and
    # 6000 on GPU 1); "shared" (3000 MiB, 20 %) comes last in name order and takes GPU 2.
    assert build_snapshot(objects).usage["n2"].gpus == (
        GpuUsage(6000, 0, 2, False),
        GpuUsage(8000, 0, 2, False),
        GpuUsage(6000, 20, 2, False),
        GpuUsage(4000, 0, 1, False),
    )


def test_snapshot_errors_name_the_object() -> None:
    objects = cluster()
    bad = copy.deepcopy(objects[1])
    bad["spec"]["pcie"][0][0] = "SYS"
    objects[1] = bad
    with pytest.raises(ValueError) as err:
        build_snapshot(objects)
    assert str(err.value) == "GPUInventory n1: spec.pcie[0][0]: must be X, got 'SYS'"
    problems: list[str] = []
    snap = build_snapshot(objects, on_error=problems.append)
    assert problems == ["GPUInventory n1: spec.pcie[0][0]: must be X, got 'SYS'"]
    assert snap.nodes["n1"].inventory_source == "none"  # no labels to fall back on


def test_is_cluster_kind() -> None:
    assert [
        is_cluster_kind({"kind": k})
        for k in ("Node", "Pod", "GPUInventory", "Namespace", "ResourceQuota", "Service", "Deployment")
    ] == [True] * 5 + [False] * 2
    assert not is_cluster_kind("Node")
