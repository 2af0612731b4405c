"""`gpu-admission check` on resources NVIDIA's device plugin advertises under a name of its own (time-slicing
replicas `nvidia.com/gpu.shared`, a renamed MPS resource `nvidia.com/gpu-10gb`): the report names the
resource the nodes offer, as the allocation stores it, never as a MIG profile. Public manifests from
tests/fixtures/accelerators (nebuly-ai/nos, Apache-2.0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from webhook.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "accelerators"
TIME_SLICED = FIXTURES / "nos-demos-gpu-sharing-comparison-manifests-overlays-ts-patch.yaml"
RENAMED = FIXTURES / "nos-demos-gpu-sharing-comparison-manifests-overlays-mps-patch.yaml"
NAME = "Deployment nos-gpu-sharing-comparison/benchmarks-client"
CLUSTER = """
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: ts-1
    labels: {nvidia.com/gpu.product: Tesla-T4, nvidia.com/gpu.count: "4", nvidia.com/gpu.memory: "15360",
             nvidia.com/gpu.replicas: "10", nvidia.com/gpu.sharing-strategy: time-slicing}
  status:
    allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu.shared: "40"}
- apiVersion: v1
  kind: Node
  metadata:
    name: mps-1
    labels: {nvidia.com/gpu.product: NVIDIA-A100-80GB-PCIe, nvidia.com/gpu.count: "1",
             nvidia.com/gpu.memory: "81920", nvidia.com/gpu.replicas: "8", nvidia.com/gpu.sharing-strategy: mps}
  status:
    allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu-10gb: "8"}
- apiVersion: v1
  kind: Namespace
  metadata: {name: nos-gpu-sharing-comparison, labels: {gpu-admission.io/enabled: "true"}}
"""
CASES = [(TIME_SLICED, "nvidia.com/gpu.shared", 15360), (RENAMED, "nvidia.com/gpu-10gb", 10240)]


@pytest.fixture()
def cluster(tmp_path: Path) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return str(path)


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


@pytest.mark.parametrize(("fixture", "resource", "memory"), CASES)
def test_text_names_the_resource_the_nodes_offer(cluster: str, capsys, fixture: Path, resource: str,
                                                 memory: int) -> None:
    code, out = check(capsys, "--cluster", cluster, str(fixture))
    assert code == 0
    assert out.splitlines() == [
        f"ALLOW  {NAME}: on a node offering {resource}, 1 device(s) x {memory} MiB  [{fixture}:0]",
        "1 allowed, 0 denied, 0 skipped",
    ]


@pytest.mark.parametrize(("fixture", "resource", "memory"), CASES)
def test_replicas_name_the_resource_too(tmp_path: Path, cluster: str, capsys, fixture: Path, resource: str,
                                        memory: int) -> None:
    doc = yaml.safe_load(fixture.read_text())
    doc["spec"]["replicas"] = 3
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out = check(capsys, "--cluster", cluster, str(path))
    assert code == 0
    assert out.splitlines()[0] == (f"ALLOW  {NAME} x3: 3 pods admitted; on nodes offering {resource}; "
                                   f"1 device(s) x {memory} MiB each  [{path}:0]")


@pytest.mark.parametrize(("fixture", "resource", "memory"), CASES)
def test_json_and_table_keep_the_full_resource_name(cluster: str, capsys, fixture: Path, resource: str,
                                                    memory: int) -> None:
    code, out = check(capsys, "--cluster", cluster, "-o", "json", str(fixture))
    assert code == 0
    [result] = json.loads(out)["results"]
    assert result["allowed"] is True
    allocation = result["allocation"]
    assert (allocation["mig"], allocation["gpuCount"], allocation["memoryMiB"]) == (resource, 1, memory)
    assert "nvidia.com/mig-" not in out and "MIG" not in out
    code, out = check(capsys, "--cluster", cluster, "-o", "table", str(fixture))
    row = out.splitlines()[1].split()
    assert row[:8] == ["ALLOW", "Deployment", "nos-gpu-sharing-comparison", "benchmarks-client", "1", "<none>",
                       f"1x{resource}", f"{memory}MiB"]


def test_a_mig_profile_is_still_named_as_one(tmp_path: Path, cluster: str, capsys) -> None:
    mig = CLUSTER.replace("nvidia.com/gpu.shared: \"40\"", "nvidia.com/mig-3g.40gb: \"2\"")
    (tmp_path / "mig.yaml").write_text(mig)
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: nos-gpu-sharing-comparison}\n"
                   "spec: {containers: [{name: c, image: cuda, resources: {limits: {nvidia.com/mig-3g.40gb: 1}}}]}\n")
    code, out = check(capsys, "--cluster", str(tmp_path / "mig.yaml"), str(pod))
    assert code == 0
    assert out.splitlines()[0].startswith(
        "ALLOW  Pod nos-gpu-sharing-comparison/p: on a node offering nvidia.com/mig-3g.40gb, 1 MIG device(s) x ")
