"""Hygon DCU and Cambricon MLU as HAMi runs them: their own selection annotations matched against the
devices HAMi registers, no CUDA limit variable (their runtimes never read one), messages that name the
vendor's annotations, and no NVLink/PCIe loss figure for links the topology model does not describe."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jsonpatch
import pytest
from builders import A100, node, pod, snapshot

from webhook.cluster.translate import node_of, quotas_of
from webhook.core.admission import admit
from webhook.core.domain.model import Snapshot
from webhook.core.podspec.resources import parse_pod
from webhook.core.policy.model import Policy

# HAMi's Hygon device plugin registers each DCU as id,count,devmem,devcore,type,numa,health,index,mode.
DCU_REGISTER = ("DCU-uuid-0,10,65520,100,DCU-K100_AI,0,true,0,hami-core:"
                "DCU-uuid-1,10,65520,100,DCU-K100_AI,0,true,1,hami-core:")
Z100_REGISTER = "DCU-z-0,10,32752,100,DCU-Z100L,0,true,0,hami-core:"


def dcu_node(name: str, register: str | None, cards: int = 2) -> dict[str, Any]:
    annotations = {"hami.io/node-dcu-register": register} if register is not None else {}
    allocatable = {"cpu": "64", "memory": "256Gi", "hygon.com/dcunum": str(10 * cards)}
    return {"kind": "Node", "metadata": {"name": name, "annotations": annotations},
            "status": {"allocatable": allocatable}}


def mlu_node(name: str) -> dict[str, Any]:
    allocatable = {"cpu": "64", "memory": "256Gi", "cambricon.com/vmlu": "4",
                   "cambricon.com/mlu370.smlu.vmemory": "384", "cambricon.com/mlu370.smlu.vcore": "400"}
    return {"kind": "Node", "metadata": {"name": name}, "status": {"allocatable": allocatable}}


def cluster() -> Snapshot:
    return snapshot(node_of(dcu_node("k100", DCU_REGISTER)), node_of(dcu_node("z100", Z100_REGISTER, 1)),
                    node_of(mlu_node("mlu")), node("a100", A100, 8))


def chain(p: dict[str, Any], snap: Snapshot) -> tuple[Any, dict[str, Any]]:
    m = admit.mutate(p, snap, Policy())
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    v = admit.validate(patched, snap, Policy())
    assert v.allowed, v.message
    return m, patched


@pytest.mark.parametrize("limits", [
    {"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000, "hygon.com/dcucores": 60},
    {"cambricon.com/vmlu": 1, "cambricon.com/mlu370.smlu.vmemory": 20, "cambricon.com/mlu370.smlu.vcore": 10},
])
def test_dcu_and_mlu_slices_get_no_cuda_limit_variable(limits: dict[str, Any]) -> None:
    m, patched = chain(pod(limits), cluster())
    container = patched["spec"]["containers"][0]
    assert "env" not in container  # CUDA_DEVICE_MEMORY_LIMIT_* is NVIDIA's HAMi-core; DTK and Neuware never read it
    assert m.allocation is not None and m.allocation.vendor in ("hygon", "cambricon")


def test_registered_dcus_carry_their_model_and_uuid() -> None:
    k100 = node_of(dcu_node("k100", DCU_REGISTER))
    assert [(g.uuid, g.model, g.memory_mib) for g in k100.gpus] == [
        ("DCU-uuid-0", "DCU-K100_AI", 65520), ("DCU-uuid-1", "DCU-K100_AI", 65520)]
    assert node_of(dcu_node("plain", None)).gpus[0].model == "DCU"  # no register: the generic name


def test_hami_dcu_type_example_lands_on_its_card_type() -> None:
    # HAMi's examples/hygon/specify_card_type_to_use.yaml annotation, on a real register.
    p = pod({"hygon.com/dcunum": 1}, annotations={"hygon.com/use-dcutype": "DCU-K100_AI"})
    m, _ = chain(p, cluster())
    assert m.allocation is not None and m.allocation.node == "k100"
    m, _ = chain(pod({"hygon.com/dcunum": 1}, annotations={"hygon.com/nouse-dcutype": "K100"}), cluster())
    assert m.allocation is not None and m.allocation.node == "z100"


def test_dcu_uuid_selection_matches_registered_ids() -> None:
    m, _ = chain(pod({"hygon.com/dcunum": 1}, annotations={"hygon.com/use-gpuuuid": "DCU-uuid-1"}), cluster())
    assert m.allocation is not None and m.allocation.uuids == ("DCU-uuid-1",)


def test_mlu_uuid_selection_uses_hamis_device_ids() -> None:
    m, _ = chain(pod({"cambricon.com/vmlu": 1}, annotations={"cambricon.com/use-gpuuuid": "mlu-cambricon-mlu-2"}),
                 cluster())
    assert m.allocation is not None and m.allocation.uuids == ("mlu-cambricon-mlu-2",)


def test_a_dcu_model_no_node_has_names_the_hygon_annotations() -> None:
    denied = admit.mutate(pod({"hygon.com/dcunum": 1}, annotations={"hygon.com/use-dcutype": "BW1000"}),
                          cluster(), Policy())
    assert (denied.allowed, denied.code) == (False, 422)
    assert denied.message.endswith("change hygon.com/use-dcutype or hygon.com/nouse-dcutype")
    assert "nvidia.com/" not in denied.message


def test_another_vendors_selector_does_not_filter_dcus() -> None:
    # HAMi's Hygon devices read only hygon.com/*; an NVIDIA model filter leaves them alone.
    request = parse_pod(pod({"hygon.com/dcunum": 1}, annotations={"nvidia.com/use-gputype": "A100"}))
    assert request.models_include == ()
    assert admit.mutate(pod({"hygon.com/dcunum": 1}, annotations={"nvidia.com/use-gputype": "A100"}),
                        cluster(), Policy()).allowed


def test_multi_dcu_pods_get_no_nvidia_link_loss() -> None:
    m, _ = chain(pod({"hygon.com/dcunum": 2}), cluster())
    assert m.allocation is not None and m.allocation.loss == 0.0
    assert not any("communication loss" in w for w in m.warnings)


def test_a_malformed_register_names_the_annotation() -> None:
    with pytest.raises(ValueError, match=r"metadata.annotations\[hami.io/node-dcu-register\]: entry 0"):
        node_of(dcu_node("bad", "DCU-0,10,lots,100,DCU,0,true:"))


def quota_cluster(hard: dict[str, str]) -> Snapshot:
    base = cluster()
    obj = {"kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team-a"}, "spec": {"hard": hard}}
    return replace(base, quotas={"team-a": (quotas_of(obj),)})


def test_dcu_and_mlu_pods_are_not_charged_as_nvidia_gpus() -> None:
    no_nvidia = quota_cluster({"requests.nvidia.com/gpu": "0", "limits.nvidia.com/gpumem": "0"})
    assert admit.mutate(pod({"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000}), no_nvidia, Policy()).allowed
    assert admit.mutate(pod({"cambricon.com/vmlu": 1}), no_nvidia, Policy()).allowed
    assert not admit.mutate(pod({"nvidia.com/gpu": 1}), no_nvidia, Policy()).allowed


def test_hamis_hygon_quota_keys_are_enforced() -> None:
    snap = quota_cluster({"limits.hygon.com/dcumem": "3000", "requests.hygon.com/dcunum": "4"})
    denied = admit.mutate(pod({"hygon.com/dcunum": 2, "hygon.com/dcumem": 2000}), snap, Policy())
    assert (denied.allowed, denied.reason) == (False, "quota-exceeded")
    assert "limits.hygon.com/dcumem used 0 MiB, asked 4000 MiB, limit 3000 MiB" in denied.message
    assert admit.mutate(pod({"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000}), snap, Policy()).allowed


def test_hamis_cambricon_memory_quota_is_in_256_mib_units() -> None:
    # HAMi multiplies limits.cambricon.com/<model>.smlu.vmemory by its memory factor, 256 MiB.
    snap = quota_cluster({"limits.cambricon.com/mlu370.smlu.vmemory": "10"})
    asked = {"cambricon.com/vmlu": 1, "cambricon.com/mlu370.smlu.vmemory": 20}
    denied = admit.mutate(pod(asked), snap, Policy())
    assert (denied.allowed, denied.reason) == (False, "quota-exceeded")
    assert "limits.cambricon.com/mlu.smlu.vmemory used 0 MiB, asked 5120 MiB, limit 2560 MiB" in denied.message
    assert admit.mutate(pod({**asked, "cambricon.com/mlu370.smlu.vmemory": 10}), snap, Policy()).allowed


def test_mlu_slices_stay_in_the_pod_for_the_default_scheduler() -> None:
    # Cambricon's device plugin advertises <model>.smlu.vmemory and .smlu.vcore: the scheduler fits them
    # and the plugin sizes the MLU slice from them, so they stay.
    limits = {"cambricon.com/vmlu": 1, "cambricon.com/mlu370.smlu.vmemory": 20, "cambricon.com/mlu370.smlu.vcore": 10}
    _, patched = chain(pod(limits), cluster())
    assert patched["spec"]["containers"][0]["resources"]["limits"] == limits


def test_a_dcu_slice_outside_hamis_scheduler_is_admitted_with_a_warning() -> None:
    limits = {"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000}
    m, patched = chain(pod(limits), cluster())
    assert m.warnings == ("hygon.com/dcumem and dcucores are enforced only with schedulerName: hami-scheduler; "
                          "recorded and counted here",)
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {"hygon.com/dcunum": 1}
    m, patched = chain(pod(limits, schedulerName="hami-scheduler"), cluster())
    assert m.warnings == () and patched["spec"]["containers"][0]["resources"]["limits"] == limits


def test_mlu_type_annotations_filter_on_the_advertised_model() -> None:
    assert admit.mutate(pod({"cambricon.com/vmlu": 1}, annotations={"cambricon.com/use-mlutype": "mlu370"}),
                        cluster(), Policy()).allowed
    denied = admit.mutate(pod({"cambricon.com/vmlu": 1}, annotations={"cambricon.com/use-mlutype": "MLU590"}),
                          cluster(), Policy())
    assert (denied.allowed, denied.code) == (False, 422)
    assert denied.message.endswith("change cambricon.com/use-mlutype or cambricon.com/nouse-mlutype")
