"""Resources NVIDIA's device plugin advertises under a name of its own: time-slicing and MPS replicas with
`renameByDefault` (`nvidia.com/gpu.shared`) and `rename`d ones (`nvidia.com/gpu-10gb`). They are GPU
requests, decided as MIG devices are: only nodes whose allocatable names the resource, no limit variable
(the plugin enforces its sharing), counted under `requests.<resource>`, never as whole GPUs. Public
manifests from tests/fixtures/accelerators (nebuly-ai/nos, Apache-2.0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from builders import A100, QuotaLimits, node, pod, snapshot

from webhook.cluster.translate import build_snapshot, node_of
from webhook.core.admission import admit
from webhook.core.domain.model import GpuUsage, Snapshot, Usage
from webhook.core.domain.vendor_quota import device_quota_key, device_resource, quota_key
from webhook.core.placement.mig import offer_of
from webhook.core.podspec.record import ANNOTATION
from webhook.core.podspec.resources import parse_pod
from webhook.core.podspec.vendor_table import device_kind
from webhook.core.policy.model import Policy

FIXTURES = Path(__file__).parent.parent / "fixtures" / "accelerators"
# GPU Feature Discovery's labels on a node whose four T4s the device plugin time-slices ten ways with
# renameByDefault: true (the product keeps its name: the renamed resource already says "shared").
TIME_SLICED = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "15360",
               "nvidia.com/gpu.replicas": "10", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
MPS = {"nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe", "nvidia.com/gpu.count": "1",
       "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "mps"}


def node_obj(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "32", "memory": "128Gi", **allocatable}}}


def cluster(**quotas: Any) -> Snapshot:
    shared = node_of(node_obj("ts-1", TIME_SLICED, {"nvidia.com/gpu.shared": "40"}))
    renamed = node_of(node_obj("mps-1", MPS, {"nvidia.com/gpu-10gb": "8"}))
    limits = {"team-a": (QuotaLimits("q", **quotas),)} if quotas else None
    return snapshot(shared, renamed, node("a100-1", A100, 8), quotas=limits)


def template(name: str) -> dict[str, Any]:
    """The pod template of a public Deployment, in a managed namespace."""
    doc = yaml.safe_load((FIXTURES / name).read_text())
    found: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", **doc["spec"]["template"]}
    found["metadata"] = {"name": "benchmarks-client", "namespace": "team-a"}
    return found


def chain(p: dict[str, Any], snap: Snapshot) -> tuple[Any, dict[str, Any], Any]:
    m = admit.mutate(p, snap, Policy())
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    v = admit.validate(patched, snap, Policy())
    assert v.allowed, v.message
    return m, patched, v


def required_nodes(patched: dict[str, Any]) -> list[str]:
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [v for t in terms["nodeSelectorTerms"] for f in t.get("matchFields", []) for v in f["values"]]


def test_a_renamed_resource_is_a_device_kind_of_its_own() -> None:
    assert device_kind("nvidia.com/gpu.shared") == "nvidia.com/gpu.shared"
    assert device_kind("nvidia.com/gpu-10gb") == "nvidia.com/gpu-10gb"
    assert device_kind("nvidia.com/mig-3g.20gb") == "3g.20gb"  # MIG profiles as before
    assert [device_kind(n) for n in ("nvidia.com/gpu", "nvidia.com/gpumem", "hygon.com/dcu-x", "amd.com/gpu")] == [
        "", "", "", ""]
    assert (device_resource("3g.20gb"), device_resource("nvidia.com/gpu.shared")) == (
        "nvidia.com/mig-3g.20gb", "nvidia.com/gpu.shared")
    assert device_quota_key("nvidia.com/gpu.shared") == "requests.nvidia.com/gpu.shared"
    request = parse_pod(pod({"nvidia.com/gpu.shared": 1}))
    assert (request.vendor, request.gpus, request.mig, request.is_gpu_pod, request.warnings) == (
        "nvidia", 1, "nvidia.com/gpu.shared", True, ())


def test_a_time_sliced_node_offers_its_replicas_and_no_whole_card() -> None:
    shared = node_of(node_obj("ts-1", TIME_SLICED, {"nvidia.com/gpu.shared": "40"}))
    assert shared.gpus == ()  # GFD still counts 4 cards; the plugin gives none of them as nvidia.com/gpu
    assert shared.mig == {"nvidia.com/gpu.shared": (40, 15360)}  # time-slicing shares the whole card
    both = node_of(node_obj("ts-2", TIME_SLICED, {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "40"}))
    assert both.gpus == () and "nvidia.com/gpu.shared" in both.mig


def test_an_mps_replica_records_its_share_of_the_card_and_a_renamed_one_its_name() -> None:
    assert offer_of(MPS, {"nvidia.com/gpu.shared": "4"}) == {"nvidia.com/gpu.shared": (4, 20480)}
    assert offer_of(MPS, {"nvidia.com/gpu-10gb": "8"}) == {"nvidia.com/gpu-10gb": (8, 10240)}
    assert offer_of({}, {"nvidia.com/gpu.shared": "3"}) == {"nvidia.com/gpu.shared": (3, 0)}  # memory unknown
    assert offer_of(TIME_SLICED, {"nvidia.com/gpu.shared": "0"}) == {}


def test_the_public_time_slicing_deployment_goes_only_to_nodes_advertising_its_resource() -> None:
    m, patched, v = chain(template("nos-demos-gpu-sharing-comparison-manifests-overlays-ts-patch.yaml"), cluster())
    assert required_nodes(patched) == ["ts-1"]
    container = patched["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu.shared": 1}  # the kubelet's resource stays
    assert "env" not in container  # the plugin's sharing is the enforcement: no HAMi-core variable
    assert m.message == "on a node offering nvidia.com/gpu.shared"
    record = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    assert (record["mig"], record["gpuCount"], record["memoryMiB"], record["model"]) == (
        "nvidia.com/gpu.shared", 1, 15360, "Tesla-T4")
    assert v.allocation is not None and v.allocation.usage() == Usage(keys=(("requests.nvidia.com/gpu.shared", 1),))
    again = admit.mutate(patched, cluster(), Policy())
    assert again.allowed and again.patch == ()


def test_the_public_mps_deployment_goes_to_the_node_advertising_its_renamed_resource() -> None:
    _, patched, v = chain(template("nos-demos-gpu-sharing-comparison-manifests-overlays-mps-patch.yaml"), cluster())
    assert required_nodes(patched) == ["mps-1"]
    record = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    assert (record["mig"], record["memoryMiB"], record["model"]) == (
        "nvidia.com/gpu-10gb", 10240, "NVIDIA-A100-80GB-PCIe")
    assert v.allocation is not None and v.allocation.usage().keys == (("requests.nvidia.com/gpu-10gb", 1),)


def test_no_node_advertising_the_resource_is_a_422_naming_it() -> None:
    denied = admit.mutate(pod({"nvidia.com/gpu.shared": 1}), snapshot(node("a100-1", A100, 8)), Policy())
    assert (denied.allowed, denied.code, denied.reason) == (False, 422, "no-such-resource")
    assert denied.message == ("no node offers nvidia.com/gpu.shared; ask for a resource a node offers, or for "
                              "nvidia.com/gpu")
    too_many = admit.mutate(pod({"nvidia.com/gpu.shared": 41}), cluster(), Policy())
    assert (too_many.allowed, too_many.code) == (False, 422)
    assert "no node offers that many (at most 40, on ts-1)" in too_many.message


def test_whole_card_pods_never_go_to_a_node_advertising_only_replicas() -> None:
    _, patched, _ = chain(pod({"nvidia.com/gpu": 1}), cluster())
    assert required_nodes(patched) == ["a100-1"]
    only_shared = snapshot(node_of(node_obj("ts-1", TIME_SLICED, {"nvidia.com/gpu.shared": "40"})))
    assert not admit.mutate(pod({"nvidia.com/gpu": 1}), only_shared, Policy()).allowed


def test_replicas_count_under_their_own_quota_key_never_as_gpus() -> None:
    # No whole GPU left in the namespace: a replica is not one (the API server charges its own key).
    chain(pod({"nvidia.com/gpu.shared": 2}), cluster(gpus=0, memory_mib=0, cores=0))
    denied = admit.mutate(pod({"nvidia.com/gpu.shared": 2}),
                          cluster(keys=(("requests.nvidia.com/gpu.shared", 1),)), Policy())
    assert (denied.allowed, denied.reason) == (False, "quota-exceeded")
    assert "requests.nvidia.com/gpu.shared used 0, asked 2, limit 1" in denied.message
    assert quota_key("requests.nvidia.com/gpu.shared", 8) == ("requests.nvidia.com/gpu.shared", 8)
    assert quota_key("requests.nvidia.com/mig-3g.20gb", 2) == ("requests.nvidia.com/mig-3g.20gb", 2)
    assert [quota_key(k, 1) for k in ("requests.nvidia.com/gpu", "requests.nvidia.com/gpumem", "requests.nvidia.com/")
            ] == [None, None, None]  # NVIDIA's own keys are quota fields, read elsewhere


def test_running_replica_pods_hold_no_card_and_count_under_their_resource() -> None:
    objects = [node_obj("ts-1", TIME_SLICED, {"nvidia.com/gpu.shared": "40"}),
               node_obj("a100-1", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "1",
                                   "nvidia.com/gpu.memory": "40960"}, {"nvidia.com/gpu": "1"}),
               {"kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team-a"},
                "spec": {"hard": {"requests.nvidia.com/gpu.shared": "4", "requests.nvidia.com/gpu": "1"}}}]
    running = pod({"nvidia.com/gpu.shared": 1}, nodeName="ts-1")
    running["status"] = {"phase": "Running"}
    built = build_snapshot([*objects, running])
    assert built.usage["a100-1"].gpus == (GpuUsage(),)
    assert built.namespace_usage["team-a"] == Usage(keys=(("requests.nvidia.com/gpu.shared", 1),))
    assert built.quotas["team-a"][0].keys == (("requests.nvidia.com/gpu.shared", 4),)
    assert built.quotas["team-a"][0].gpus == 1


def test_a_replica_asked_with_a_slice_or_another_device_kind_is_refused() -> None:
    mixed = admit.mutate(pod({"nvidia.com/gpu.shared": 1, "nvidia.com/gpumem": 4000}), cluster(), Policy())
    assert (mixed.allowed, mixed.code, mixed.reason) == (False, 422, "mig-mixed")
    assert ("container 'main' asks for nvidia.com/gpu.shared together with nvidia.com/gpumem; its device plugin "
            "hands out nvidia.com/gpu.shared as it is: ask for it alone") in mixed.message
    two = pod({"nvidia.com/gpu.shared": 1})
    two["spec"]["containers"].append({"name": "side", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}})
    denied = admit.mutate(two, cluster(), Policy())
    assert (denied.allowed, denied.code) == (False, 422)
    assert ("the pod asks for whole GPUs and nvidia.com/gpu.shared; ask for one device resource per pod, or for "
            "whole GPUs") in denied.message
