"""Accelerators outside the vendor table (Intel GPUs and FPGAs, Habana Gaudi, AMD GPUs, AWS Neuron, TPUs,
Xilinx FPGAs) get the unknown-accelerator answer: admitted unchanged, with a warning that nothing counts or
limits them, and an answer that says so, never "asks for no GPU". Public manifests from
tests/fixtures/accelerators, unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import H100, node, pod, snapshot

from webhook.cli import main
from webhook.core.admission import admit
from webhook.core.podspec.accelerators import looks_like_gpu
from webhook.core.podspec.fastpath import needs_decision
from webhook.core.podspec.vendor_table import classify_resource
from webhook.core.policy.model import Policy

FIXTURES = Path(__file__).parent.parent / "fixtures" / "accelerators"
CLUSTER = snapshot(node("h1", H100, 8))
REASON = "accelerator-not-counted"


def template(name: str) -> dict[str, Any]:
    """The pod of a public manifest (a Pod, or a Job's or Deployment's template), in a managed namespace."""
    doc = yaml.safe_load((FIXTURES / name).read_text())
    found = doc if doc["kind"] == "Pod" else {"apiVersion": "v1", "kind": "Pod", **doc["spec"]["template"]}
    found.setdefault("metadata", {})
    found["metadata"].update(name="p", namespace="team-a")
    return found


@pytest.mark.parametrize(("name", "resource"), [
    ("intel-device-plugins-demo-intelgpu-job.yaml", "gpu.intel.com/i915"),
    ("intel-device-plugins-demo-intelfpga-job.yaml", "fpga.intel.com/af-d8424dc4a4a3c413f89e433683f9040b"),
    ("platform-aware-scheduling-gpu-aware-scheduling-docs-example-bb_example.yaml", "gpu.intel.com/millicores"),
    ("habanalabs-k8s-device-plugin-examples-hl-smi-test.yml", "habana.ai/gaudi"),
    ("rocm-k8s-device-plugin-example-pod-pytorch.yaml", "amd.com/gpu"),
])
def test_public_manifests_of_other_accelerators_get_the_unknown_accelerator_answer(name: str, resource: str) -> None:
    p = template(name)
    assert needs_decision(p)  # the server's fast path sends it to the core, so the warning reaches the user
    for decision in (admit.mutate(p, CLUSTER, Policy()), admit.validate(p, CLUSTER, Policy())):
        assert (decision.allowed, decision.reason, decision.patch, decision.gpu_pod) == (True, REASON, (), False)
        assert resource in decision.message and "does not count or limit" in decision.message
        assert any(resource in w and "is not counted" in w for w in decision.warnings), decision.warnings


def test_every_accelerator_resource_is_named_in_the_answer() -> None:
    decision = admit.mutate(template("platform-aware-scheduling-gpu-aware-scheduling-docs-example-bb_example.yaml"),
                            CLUSTER, Policy())
    assert decision.message == ("asks for gpu.intel.com/i915, gpu.intel.com/millicores, which this controller does "
                                "not count or limit: unchanged")


@pytest.mark.parametrize("name", [
    "gpu.intel.com/i915", "gpu.intel.com/xe", "gpu.intel.com/millicores", "gpu.intel.com/memory.max",
    "gpu.intel.com/i915_monitoring", "fpga.intel.com/af-695.d84.aVKNtusxV3qMNmj5-qCB9thCTcSko8QT-J5DNoP5BAs",
    "npu.intel.com/accel", "habana.ai/gaudi", "habana.ai/goya", "amd.com/gpu", "aws.amazon.com/neuron",
    "aws.amazon.com/neuroncore", "aws.amazon.com/neurondevice", "google.com/tpu",
    "xilinx.com/fpga-xilinx_u200_xdma_201830_2-1561465320", "huawei.com/Ascend910", "metax-tech.com/gpu",
])
def test_accelerator_names_are_recognised_by_domain_or_word(name: str) -> None:
    assert looks_like_gpu(name) and classify_resource(name) is None
    decision = admit.mutate(pod({name: 1}), CLUSTER, Policy())
    assert (decision.allowed, decision.reason, decision.patch) == (True, REASON, ())


@pytest.mark.parametrize("name", ["cpu", "memory", "hugepages-2Mi", "ephemeral-storage", "rdma/roce_gdr",
                                  "rdma/hca_shared_devices_a", "vpc.amazonaws.com/efa", "example.com/foo",
                                  "nvidia.com/priority", "intel.com/sriov_netdevice"])
def test_other_resources_are_no_accelerators(name: str) -> None:
    assert not looks_like_gpu(name)


def test_a_pod_asking_for_no_accelerator_is_still_not_a_gpu_pod() -> None:
    decision = admit.mutate(pod({"cpu": "1"}), CLUSTER, Policy())
    assert (decision.allowed, decision.reason, decision.warnings) == (True, "not-gpu-pod", ())


def test_an_accelerator_pod_that_can_reach_an_nvidia_node_is_screened_like_any_pod_asking_for_none() -> None:
    p = template("habanalabs-k8s-device-plugin-examples-hl-smi-test.yml")
    p["spec"]["tolerations"] = [{"operator": "Exists"}]
    decision = admit.mutate(p, CLUSTER, Policy())
    assert decision.allowed
    assert {"op": "add", "path": "/spec/containers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]} in [dict(op) for op in decision.patch]
    assert any("habana.ai/gaudi is not counted" in w for w in decision.warnings)


def test_check_says_what_an_intel_gpu_job_gets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump_all([
        {"kind": "Node", "metadata": {"name": "h1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
         "status": {"allocatable": {"nvidia.com/gpu": "8"}}},
        {"kind": "Namespace", "metadata": {"name": "default", "labels": {"gpu-admission.io/enabled": "true"}}},
    ]))
    assert main(["check", "--cluster", str(cluster_file), str(FIXTURES / "intel-device-plugins-demo-intelgpu-job.yaml")
                 ]) == 0
    out = capsys.readouterr().out
    assert "asks for no GPU" not in out
    assert ("no GPU allocated (accelerator-not-counted: asks for gpu.intel.com/i915, which this controller does not "
            "count or limit: unchanged)") in out
