"""The NVIDIA container toolkit's variables, sorted by what they reach: those that widen a container's reach
beyond the GPUs the device plugin gave it are refused (isolation-env), the others pass. KServe's public
DeepSeek sample (tests/fixtures/accelerators) sets NVIDIA_GDRCOPY=enabled next to its nvidia.com/gpu."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from builders import H100, node, pod, snapshot

from webhook.cli import main
from webhook.core.admission import admit
from webhook.core.admission.env_pins import harmless
from webhook.core.admission.envfrom import env_from_keys
from webhook.core.podspec.fastpath import is_gpu_pod
from webhook.core.podspec.limits import ENV_FROM_PINS, ISOLATION_ENV, TOOLKIT_NARROW_ENV, is_isolation_env
from webhook.core.policy.model import Policy

FIXTURES = Path(__file__).parent.parent / "fixtures" / "accelerators"
DEEPSEEK = FIXTURES / ("kserve-docs-samples-llmisvc-dp-ep-deepseek-r1-gpu-rdma-roce-llm-inference-service-dp-ep-"
                       "deepseek-r1-gpu-deepep-ht.yaml")
CLUSTER = snapshot(node("h1", H100, 8), node("h2", H100, 8))
WIDENING = ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES",
            "NVIDIA_IMEX_CHANNELS", "NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH"]


def chain(p: dict[str, Any], snap: Any = CLUSTER) -> tuple[Any, dict[str, Any], Any]:
    m = admit.mutate(p, snap, Policy())
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    v = admit.validate(patched, snap, Policy())
    assert v.allowed, v.message
    return m, patched, v


def deepseek_pods() -> list[dict[str, Any]]:
    """The LLMInferenceService's leader (`template`) and worker pod specs, as pods in a managed namespace."""
    spec = yaml.safe_load(DEEPSEEK.read_text())["spec"]
    return [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": part, "namespace": "team-a"}, "spec": spec[part]}
            for part in ("template", "worker")]


@pytest.mark.parametrize("index", [0, 1])
def test_kserve_deepseek_sample_with_gdrcopy_is_admitted(index: int) -> None:
    p = deepseek_pods()[index]
    _, patched, v = chain(p)
    env = {e["name"]: e.get("value") for e in patched["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_GDRCOPY"] == "enabled"  # kept: GDRCopy maps only the container's own GPU memory
    assert v.allocation is not None and v.allocation.gpu_count == 8


def test_check_admits_the_kserve_deepseek_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster_file = tmp_path / "cluster.yaml"
    nodes = [{"kind": "Node", "metadata": {"name": f"h{i}", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559"}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}} for i in range(4)]
    cluster_file.write_text(yaml.safe_dump_all([
        *nodes,
        {"kind": "Namespace", "metadata": {"name": "default", "labels": {"gpu-admission.io/enabled": "true"}}},
    ]))
    assert main(["check", "--cluster", str(cluster_file), str(DEEPSEEK)]) == 0
    out = capsys.readouterr().out
    assert "DENY" not in out and "NVIDIA_GDRCOPY" not in out


@pytest.mark.parametrize(("name", "value"), [
    ("NVIDIA_GDRCOPY", "enabled"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility,graphics"),
    ("NVIDIA_REQUIRE_CUDA", "cuda>=12.4"), ("NVIDIA_DISABLE_REQUIRE", "true"), ("CUDA_VERSION", "12.4.1"),
])
def test_toolkit_variables_that_reach_nothing_more_pass(name: str, value: str) -> None:
    assert name in TOOLKIT_NARROW_ENV and not is_isolation_env(name)
    entry = {"name": name, "value": value}
    chain(pod({"nvidia.com/gpu": 1}, env=[entry]))
    # A pod asking for no GPU is no GPU pod for setting one: the toolkit gives it nothing either way.
    cpu = pod({"cpu": "1"}, env=[entry])
    assert not is_gpu_pod(cpu)
    assert admit.mutate(cpu, CLUSTER, Policy()).reason == "not-gpu-pod"


@pytest.mark.parametrize("name", WIDENING)
def test_toolkit_variables_that_widen_a_containers_reach_are_refused(name: str) -> None:
    assert name in ISOLATION_ENV and name not in TOOLKIT_NARROW_ENV
    value = "all" if name in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_IMEX_CHANNELS") else "enabled"
    decision = admit.mutate(pod({"nvidia.com/gpu": 1}, env=[{"name": name, "value": value}]), CLUSTER, Policy())
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "isolation-env")
    assert f"sets {name} itself" in decision.message


def test_the_refusal_of_mofed_names_the_route_that_works() -> None:
    decision = admit.mutate(pod({"nvidia.com/gpu": 1}, env=[{"name": "NVIDIA_MOFED", "value": "enabled"}]),
                            CLUSTER, Policy())
    assert decision.message.endswith("ask for RDMA devices from their device plugin in resources.limits "
                                     "(e.g. rdma/roce_gdr: 1)")


def test_gdrcopy_from_a_config_map_or_a_secret_needs_no_pin() -> None:
    assert env_from_keys({"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled"}) == frozenset({"NVIDIA_GDS"})
    assert "NVIDIA_GDRCOPY" not in ENV_FROM_PINS and ENV_FROM_PINS["NVIDIA_GDS"] == "disabled"
    assert harmless("NVIDIA_GDR") and not harmless("NVIDIA_GD")
    maps = {"team-a": {"rdma": env_from_keys({"NVIDIA_GDRCOPY": "enabled", "UCX_TLS": "rc"})}}
    snap = dataclasses.replace(CLUSTER, config_maps=maps)
    p = pod({"nvidia.com/gpu": 1})
    p["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "rdma"}}]
    chain(p, snap)
