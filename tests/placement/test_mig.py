"""NVIDIA MIG devices: `nvidia.com/mig-<profile>` requests go only to nodes offering that profile, with the
profile's memory recorded and charged (never a whole nvidia.com/gpu), no limit variable, and a 422 naming
the profile when no node offers it. Node offers come from allocatable, GFD labels or the inventory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fake_nvml
import jsonpatch
import pytest
import yaml
from builders import A100, QuotaLimits, node, pod, snapshot

from webhook.agent.discovery import discover, mig_profile_name
from webhook.agent.nvml import start
from webhook.cli import main
from webhook.cluster.translate import build_snapshot, node_of
from webhook.core.admission import admit
from webhook.core.domain.model import GpuUsage, Snapshot, Usage
from webhook.core.placement.mig import offer_of
from webhook.core.podspec.inventory import InventoryError, check_inventory
from webhook.core.podspec.record import ANNOTATION
from webhook.core.podspec.resources import parse_pod
from webhook.core.podspec.vendor_table import classify_resource, mig_profile
from webhook.core.policy.model import Policy

# GFD's labels on an A100-40GB node in the "mixed" strategy (two 3g.20gb devices on GPU 0, seven 1g.5gb
# devices on GPU 1), and the device plugin's allocatable for them.
MIXED_LABELS = {
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    "nvidia.com/gpu.count": "2",
    "nvidia.com/gpu.memory": "40960",
    "nvidia.com/mig-3g.20gb.count": "2",
    "nvidia.com/mig-3g.20gb.memory": "20096",
    "nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
    "nvidia.com/mig-1g.5gb.count": "7",
    "nvidia.com/mig-1g.5gb.memory": "4864",
}
MIXED_ALLOCATABLE = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "0",
                     "nvidia.com/mig-3g.20gb": "2", "nvidia.com/mig-1g.5gb": "7"}


def node_obj(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def mig_cluster(**quotas: Any) -> Snapshot:
    mixed = node_of(node_obj("mig-1", MIXED_LABELS, MIXED_ALLOCATABLE))
    limits = {"team-a": (QuotaLimits("q", **quotas),)} if quotas else None
    return snapshot(mixed, node("a100-1", A100, 8), quotas=limits)


def chain(p: dict[str, Any], cluster: Snapshot) -> tuple[Any, dict[str, Any], Any]:
    m = admit.mutate(p, cluster, Policy())
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    v = admit.validate(patched, cluster, Policy())
    assert v.allowed, v.message
    return m, patched, v


def test_mig_names_are_mig_devices_of_their_profile() -> None:
    assert classify_resource("nvidia.com/mig-3g.20gb") == ("nvidia", "mig", 1)
    assert mig_profile("nvidia.com/mig-1g.5gb.me") == "1g.5gb.me"  # GFD's spelling of NVML's 1g.5gb+me
    assert mig_profile("nvidia.com/mig-1c.3g.20gb") == "1c.3g.20gb"
    assert mig_profile("nvidia.com/gpu") == ""
    assert classify_resource("nvidia.com/mig-foo") == ("nvidia", "device", 1)  # not a profile: as before


def test_a_mig_request_names_its_profile_without_a_vendor_table_warning() -> None:
    request = parse_pod(pod({"nvidia.com/mig-3g.20gb": 2}))
    assert (request.vendor, request.gpus, request.mig, request.warnings) == ("nvidia", 2, "3g.20gb", ())
    assert request.containers[0].gpu is not None and request.containers[0].gpu.mig == "3g.20gb"


def test_gfd_labels_and_allocatable_give_the_offer_with_the_labelled_memory() -> None:
    assert offer_of(MIXED_LABELS, MIXED_ALLOCATABLE) == {"1g.5gb": (7, 4864), "3g.20gb": (2, 20096)}
    # Allocatable wins for the count (unhealthy devices are not advertised); the name gives the memory
    # when no label or inventory does.
    assert offer_of({}, {"nvidia.com/mig-2g.10gb": "3"}) == {"2g.10gb": (3, 10240)}
    assert offer_of({"nvidia.com/mig-3g.20gb.count": "2"}, {"nvidia.com/mig-3g.20gb": "1"}) == {"3g.20gb": (1, 20480)}
    assert offer_of({}, {"nvidia.com/mig-3g.20gb": "0"}) == {}


def test_single_strategy_node_offers_its_mig_devices_as_gpus_not_as_mig_resources() -> None:
    labels = {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
              "nvidia.com/gpu.count": "7", "nvidia.com/gpu.memory": "4864"}
    single = node_of(node_obj("single", labels, {"nvidia.com/gpu": "7"}))
    assert single.mig == {}
    assert [(g.model, g.memory_mib) for g in single.gpus] == [("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 4864)] * 7
    denied = admit.mutate(pod({"nvidia.com/mig-1g.5gb": 1}), snapshot(single), Policy())
    assert (denied.allowed, denied.code) == (False, 422)
    assert denied.message.startswith("no node offers nvidia.com/mig-1g.5gb;")


def test_mig_pod_goes_only_to_nodes_offering_its_profile_with_no_limit_variable() -> None:
    m, patched, v = chain(pod({"nvidia.com/mig-3g.20gb": 1}), mig_cluster())
    container = patched["spec"]["containers"][0]
    assert "env" not in container  # the hardware bounds a MIG device: no HAMi-core variable
    assert container["resources"]["limits"] == {"nvidia.com/mig-3g.20gb": 1}  # the kubelet's resource stays
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["mig-1"]}]
    record = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    assert (record["mig"], record["memoryMiB"], record["gpuCount"], record["model"]) == (
        "3g.20gb", 20096, 1, "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb")
    assert v.allocation is not None and v.allocation.mig == "3g.20gb"
    again = admit.mutate(patched, mig_cluster(), Policy())
    assert again.allowed and again.patch == ()


def test_no_node_offering_the_profile_is_a_422_naming_it() -> None:
    denied = admit.mutate(pod({"nvidia.com/mig-7g.40gb": 1}), mig_cluster(), Policy())
    assert (denied.allowed, denied.code, denied.reason) == (False, 422, "no-such-mig")
    assert denied.message == ("no node offers nvidia.com/mig-7g.40gb (offered: nvidia.com/mig-1g.5gb, "
                              "nvidia.com/mig-3g.20gb); ask for a MIG profile a node offers, or for nvidia.com/gpu")


def test_more_devices_than_any_node_offers_is_a_422() -> None:
    denied = admit.mutate(pod({"nvidia.com/mig-3g.20gb": 3}), mig_cluster(), Policy())
    assert (denied.allowed, denied.code) == (False, 422)
    assert "no node offers that many (at most 2, on mig-1)" in denied.message


def test_a_node_selector_that_excludes_every_offering_node_is_named() -> None:
    p = pod({"nvidia.com/mig-1g.5gb": 1}, nodeSelector={"pool": "inference"})
    denied = admit.mutate(p, mig_cluster(), Policy())
    assert (denied.allowed, denied.code) == (False, 422)
    assert "1 node(s) offer 1 nvidia.com/mig-1g.5gb, but nodeSelector pool=inference keeps the pod off" in (
        denied.message)


def test_mig_devices_are_charged_under_their_profile_never_as_whole_gpus() -> None:
    # No whole GPU left in the namespace: a MIG device is not one.
    m, _, v = chain(pod({"nvidia.com/mig-3g.20gb": 2}), mig_cluster(gpus=0, memory_mib=0))
    assert v.allocation is not None
    assert v.allocation.usage() == Usage(keys=(("requests.nvidia.com/mig-3g.20gb", 2),))
    # The API server's own key for the extended resource, checked here too (so check predicts it).
    denied = admit.mutate(pod({"nvidia.com/mig-3g.20gb": 2}),
                          mig_cluster(keys=(("requests.nvidia.com/mig-3g.20gb", 1),)), Policy())
    assert (denied.allowed, denied.reason) == (False, "quota-exceeded")
    assert "requests.nvidia.com/mig-3g.20gb used 0, asked 2, limit 1" in denied.message
    assert admit.mutate(pod({"nvidia.com/mig-1g.5gb": 1}),
                        mig_cluster(keys=(("requests.nvidia.com/mig-3g.20gb", 1),)), Policy()).allowed


def test_running_mig_pods_hold_no_card_and_count_under_their_profile() -> None:
    nodes = [{"kind": "Node", "metadata": {"name": "mig-1", "labels": MIXED_LABELS},
              "status": {"allocatable": {**MIXED_ALLOCATABLE, "nvidia.com/gpu": "1"}}},
             {"kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team-a"},
              "spec": {"hard": {"requests.nvidia.com/mig-3g.20gb": "2", "requests.nvidia.com/gpu": "1"}}}]
    running = pod({"nvidia.com/mig-3g.20gb": 1}, nodeName="mig-1")
    running["status"] = {"phase": "Running"}
    built = build_snapshot([*nodes, running])
    assert built.usage["mig-1"].gpus[0] == GpuUsage()  # the one card is still free
    assert built.namespace_usage["team-a"] == Usage(keys=(("requests.nvidia.com/mig-3g.20gb", 1),))
    assert built.quotas["team-a"][0].keys == (("requests.nvidia.com/mig-3g.20gb", 2),)


@pytest.mark.parametrize(("limits", "message"), [
    ({"nvidia.com/mig-3g.20gb": 1, "nvidia.com/gpumem": 4000},
     "container 'main' asks for nvidia.com/mig-3g.20gb together with nvidia.com/gpumem"),
    ({"nvidia.com/mig-3g.20gb": 1, "nvidia.com/gpu": 1},
     "container 'main' asks for nvidia.com/mig-3g.20gb together with nvidia.com/gpu"),
])
def test_a_mig_device_with_a_slice_or_a_card_is_refused(limits: dict[str, Any], message: str) -> None:
    denied = admit.mutate(pod(limits), mig_cluster(), Policy())
    assert (denied.allowed, denied.code, denied.reason) == (False, 422, "mig-mixed")
    assert message in denied.message


def test_two_profiles_in_one_pod_are_refused() -> None:
    p = pod({"nvidia.com/mig-3g.20gb": 1})
    p["spec"]["containers"].append({"name": "side", "image": "x",
                                    "resources": {"limits": {"nvidia.com/mig-1g.5gb": 1}}})
    denied = admit.mutate(p, mig_cluster(), Policy())
    assert (denied.allowed, denied.code) == (False, 422)
    assert "nvidia.com/mig-1g.5gb and nvidia.com/mig-3g.20gb; ask for one MIG profile per pod" in denied.message


def test_a_recorded_mig_profile_must_match_the_pod() -> None:
    _, patched, _ = chain(pod({"nvidia.com/mig-3g.20gb": 1}), mig_cluster())
    patched["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-1g.5gb": 1}
    denied = admit.validate(patched, mig_cluster(), Policy())
    assert (denied.allowed, denied.reason) == (False, "annotation-mismatch")


INVENTORY: dict[str, Any] = {
    "version": 1, "nvlink": [[0]], "pcie": [["X"]],
    "gpus": [{"index": 0, "uuid": "GPU-0", "model": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559, "numa": 0,
              "healthy": True, "migMode": True,
              "migDevices": [{"profile": "3g.40gb", "memoryMiB": 40192, "uuid": "MIG-a"},
                             {"profile": "3g.40gb", "memoryMiB": 40192, "uuid": "MIG-b"}]}],
}


def test_the_agent_inventory_gives_mig_devices_with_their_memory() -> None:
    n = node_of(node_obj("h100", {}, {}), {"spec": INVENTORY})
    assert n.mig == {"3g.40gb": (2, 40192)}
    m, patched, _ = chain(pod({"nvidia.com/mig-3g.40gb": 2}), snapshot(n))
    assert json.loads(patched["metadata"]["annotations"][ANNOTATION])["memoryMiB"] == 40192


@pytest.mark.parametrize(("device", "error"), [
    ({"profile": "3g.40gb"}, "spec.gpus[0].migDevices[0].memoryMiB: required"),
    ({"profile": "", "memoryMiB": 1}, "spec.gpus[0].migDevices[0].profile: must be a non-empty string"),
    ({"profile": "3g.40gb", "memoryMiB": 1, "slices": 3}, "spec.gpus[0].migDevices[0].slices: unknown field"),
])
def test_malformed_mig_devices_are_refused_naming_the_field(device: dict[str, Any], error: str) -> None:
    spec = json.loads(json.dumps(INVENTORY))
    spec["gpus"][0]["migDevices"] = [device]
    with pytest.raises(InventoryError, match=error.replace("[", r"\[").replace("]", r"\]")):
        check_inventory(spec)


def test_the_agent_reports_each_mig_device_with_profile_and_memory() -> None:
    nvml = fake_nvml.dgx_a100_mig()
    start(nvml)
    gpus = discover(nvml)["gpus"]
    assert [len(g.get("migDevices", [])) for g in gpus] == [7, 3, 0, 0, 0, 0, 0, 0]
    assert "migDevices" not in gpus[3]  # MIG mode off: no list at all
    assert gpus[1]["migDevices"] == [
        {"profile": "3g.40gb", "memoryMiB": 40192, "uuid": "MIG-a1000001-0000-4000-8000-000000000000"},
        {"profile": "3g.40gb", "memoryMiB": 40192, "uuid": "MIG-a1000001-0000-4000-8000-000000000001"},
        {"profile": "1g.10gb.me", "memoryMiB": 9856, "uuid": "MIG-a1000001-0000-4000-8000-000000000002"},
    ]
    assert mig_profile_name("NVIDIA A100-SXM4-80GB MIG 1g.10gb+me") == "1g.10gb.me"
    assert mig_profile_name("NVIDIA A100-SXM4-80GB") == ""


def test_mig_mode_gpus_are_no_cards_for_whole_gpu_pods() -> None:
    nvml = fake_nvml.dgx_a100_mig()
    start(nvml)
    n = node_of(node_obj("dgx", {}, {}), {"spec": discover(nvml)})
    assert [g.index for g in n.gpus] == [3, 4, 5, 6, 7] and len(n.nvlink) == len(n.pcie) == 5
    assert n.mig == {"1g.10gb": (7, 9856), "1g.10gb.me": (1, 9856), "3g.40gb": (2, 40192)}
    cluster = snapshot(n)
    whole = admit.mutate(pod({"nvidia.com/gpu": 6}), cluster, Policy())
    assert not whole.allowed  # five cards left, the MIG-partitioned three are not among them
    _, patched, _ = chain(pod({"nvidia.com/mig-1g.10gb.me": 1}), cluster)
    assert json.loads(patched["metadata"]["annotations"][ANNOTATION])["memoryMiB"] == 9856


def test_an_inventory_vendor_keeps_a_dcu_node_a_dcu_node() -> None:
    spec = {"version": 1, "vendor": "hygon", "nvlink": [[0]], "pcie": [["X"]],
            "gpus": [{"index": 0, "uuid": "DCU-0", "model": "Z100L", "memoryMiB": 32768, "numa": 0, "healthy": True}]}
    dcu = node_of(node_obj("dcu", {}, {}), {"spec": spec})
    assert (dcu.vendor, dcu.gpu_model, dcu.mig) == ("hygon", "Z100L", {})
    cluster = snapshot(dcu)
    assert admit.mutate(pod({"hygon.com/dcunum": 1}), cluster, Policy()).allowed
    assert not admit.mutate(pod({"nvidia.com/gpu": 1}), cluster, Policy()).allowed
    spec["vendor"] = "amd"
    with pytest.raises(InventoryError, match="spec.vendor: must be one of nvidia, hygon, cambricon, got 'amd'"):
        check_inventory(spec)


def test_a_node_advertising_only_mig_devices_has_no_whole_card() -> None:
    # GFD's nvidia.com/gpu.count counts the MIG-mode cards too; the device plugin advertises none whole.
    allocatable = {k: v for k, v in MIXED_ALLOCATABLE.items() if k != "nvidia.com/gpu"}
    only_mig = node_of(node_obj("mig-only", MIXED_LABELS, allocatable))
    assert only_mig.gpus == () and only_mig.mig == {"1g.5gb": (7, 4864), "3g.20gb": (2, 20096)}
    assert not admit.mutate(pod({"nvidia.com/gpu": 1}), snapshot(only_mig), Policy()).allowed
    assert admit.mutate(pod({"nvidia.com/mig-1g.5gb": 1}), snapshot(only_mig), Policy()).allowed


def test_check_reports_a_mig_pod_and_its_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump_all([
        node_obj("mig-1", MIXED_LABELS, MIXED_ALLOCATABLE),
        {"kind": "Namespace", "metadata": {"name": "default", "labels": {"gpu-admission.io/enabled": "true"}}},
    ]))
    manifest = Path(__file__).parent.parent / "fixtures" / "manifests" / "hami-examples-nvidia-mig_example.yaml"
    assert main(["check", "--cluster", str(cluster_file), str(manifest)]) == 0
    out = capsys.readouterr().out
    assert "ALLOW  Pod default/gpu-pod: on a node offering nvidia.com/mig-3g.20gb, 1 MIG device(s) x 20096 MiB" in out


def test_a_mig_device_pod_marked_vgpu_mode_mig_gets_no_backend_warning() -> None:
    m, _, _ = chain(pod({"nvidia.com/mig-3g.20gb": 1}, annotations={"nvidia.com/vgpu-mode": "mig"}), mig_cluster())
    assert m.warnings == ()
    # A card slice marked mig still hears that hami-core applies (HAMi's dynamic MIG is not offered).
    sliced = admit.mutate(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000},
                              annotations={"nvidia.com/vgpu-mode": "mig"}), mig_cluster(), Policy())
    assert sliced.warnings == ("annotation nvidia.com/vgpu-mode='mig': limits are enforced with hami-core here",)
