"""Cluster files (`check --cluster`) and the embedded demo cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.cluster.files import demo_objects, load_cluster
from webhook.cluster.translate import build_snapshot
from webhook.core.domain.model import GpuUsage, Usage
from webhook.errors import UserError

KUBECTL_LIST = """\
apiVersion: v1
items:
- apiVersion: v1
  kind: Node
  metadata:
    creationTimestamp: "2024-05-01T10:00:00Z"
    labels:
      nvidia.com/gpu.count: "2"
      nvidia.com/gpu.memory: "15360"
      nvidia.com/gpu.product: Tesla-T4
    name: t4-a
  spec: {}
  status:
    allocatable:
      cpu: 7910m
      memory: 28499940Ki
      nvidia.com/gpu: "2"
- apiVersion: v1
  kind: Namespace
  metadata:
    labels:
      gpu-admission.io/enabled: "true"
    name: ml
- apiVersion: v1
  kind: ResourceQuota
  metadata:
    name: gpus
    namespace: ml
  spec:
    hard:
      requests.nvidia.com/gpu: "4"
- apiVersion: v1
  kind: Service
  metadata:
    name: kubernetes
    namespace: default
- apiVersion: v1
  kind: Pod
  metadata:
    name: trainer
    namespace: ml
  spec:
    containers:
    - name: main
      resources:
        limits:
          nvidia.com/gpu: "1"
    nodeName: t4-a
  status:
    phase: Running
kind: List
metadata:
  resourceVersion: ""
"""


def test_kubectl_list_output(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(KUBECTL_LIST)
    objects = load_cluster([str(path)])
    assert [o["kind"] for o in objects] == ["Node", "Namespace", "ResourceQuota", "Pod"]
    snap = build_snapshot(objects)
    assert snap.usage["t4-a"].gpus == (GpuUsage(15360, 100, 1, True), GpuUsage())
    assert snap.nodes["t4-a"].cpu_milli == 7910
    assert snap.namespace_usage == {"ml": Usage(1, 15360, 100)}
    assert snap.namespaces["ml"].managed


def test_directories_and_json(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n.json").write_text(json.dumps({"kind": "Node", "metadata": {"name": "n"}}))
    (tmp_path / "ns.yaml").write_text("kind: Namespace\nmetadata: {name: a}\n---\nkind: Service\n")
    assert [o["kind"] for o in load_cluster([str(tmp_path)])] == ["Node", "Namespace"]


def _inventory(nvlink_row: list[int]) -> dict[str, Any]:
    return {
        "apiVersion": "gpu-admission.io/v1alpha1",
        "kind": "GPUInventory",
        "metadata": {"name": "n"},
        "spec": {
            "version": 1,
            "gpus": [
                {"index": i, "uuid": f"G{i}", "model": "M", "memoryMiB": 1, "numa": 0, "healthy": True}
                for i in range(2)
            ],
            "nvlink": [[0, 4], nvlink_row],
            "pcie": [["X", "SYS"], ["SYS", "X"]],
        },
    }


@pytest.mark.parametrize(
    ("documents", "message"),
    [
        (
            [{"kind": "Namespace", "metadata": {"name": "a"}}, _inventory([4])],
            "{path}: document 1: field spec.nvlink[1]: must have one entry per GPU (2), got 1",
        ),
        (
            [{"kind": "List", "items": [{"kind": "Pod"}, _inventory([4, 4])]}],
            "{path}: document 0: field items[1].spec.nvlink[1][1]: a GPU has no links to itself, must be 0",
        ),
        (
            [
                {
                    "kind": "ResourceQuota",
                    "metadata": {"name": "q"},
                    "spec": {"hard": {"requests.nvidia.com/gpu": "x"}},
                }
            ],
            "{path}: document 0: field spec.hard[requests.nvidia.com/gpu]: 'x' is not a Kubernetes quantity",
        ),
        (
            [{"kind": "Node", "metadata": {"name": "n", "labels": {"nvidia.com/gpu.count": "-1"}}}],
            "{path}: document 0: field metadata.labels[nvidia.com/gpu.count]: expected a whole number >= 0, got '-1'",
        ),
        ([{"kind": "Node", "metadata": {}}], "{path}: document 0: field metadata.name: required"),
    ],
)
def test_bad_objects_name_file_document_and_field(tmp_path: Path, documents: list[Any], message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    with pytest.raises(UserError) as err:
        load_cluster([str(path)])
    assert str(err.value) == message.format(path=path)


def test_bad_yaml_in_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: Node\nmetadata:\n  name: n\n  labels: {a: b\n")
    with pytest.raises(UserError) as err:
        load_cluster([str(path)])
    assert str(err.value).startswith(f"{path}: document 0: line 5, column 1: invalid YAML: ")


# --- the demo cluster -------------------------------------------------------------------------


def test_demo_cluster_shape() -> None:
    snap = build_snapshot(demo_objects())
    nodes = snap.nodes
    h100 = [n for n in nodes.values() if n.gpu_model == "NVIDIA-H100-80GB-HBM3"]
    assert len(h100) >= 2
    for node in h100:
        assert (len(node.gpus), node.inventory_source) == (8, "inventory")
        assert all(node.nvlink[i][j] == 18 for i in range(8) for j in range(8) if i != j)
    a100 = [n for n in nodes.values() if n.gpu_model.startswith("NVIDIA-A100")]
    assert len(a100) == 2
    for node in a100:
        assert node.inventory_source == "inventory"
        linked = {(i, j) for i in range(8) for j in range(8) if node.nvlink[i][j]}
        assert linked == {(i, i ^ 1) for i in range(8)}
    pcie_only = [n for n in nodes.values() if n.inventory_source == "labels"]
    assert len(pcie_only) >= 2
    assert all(not any(map(any, n.nvlink)) for n in pcie_only)
    assert {n.gpu_model for n in pcie_only} <= {"NVIDIA-L4", "Tesla-T4"}
    assert any(not n.gpus for n in nodes.values())
    assert any(t.key == "nvidia.com/gpu" for n in nodes.values() for t in n.taints)
    assert {name for name, ns in snap.namespaces.items() if ns.managed} == {"team-a", "team-b"}
    assert {"sandbox", "kube-system"} <= set(snap.namespaces)
    assert set(snap.quotas) == {"team-a", "team-b"}
    assert {q.name for q in snap.quotas["team-a"]} == {"gpu"}
    team_a = snap.quotas["team-a"][0]
    assert None not in (team_a.gpus, team_a.memory_mib, team_a.cores)


def test_demo_cluster_running_pods() -> None:
    objects = demo_objects()
    pods = [o for o in objects if o["kind"] == "Pod"]
    annotated = [p for p in pods if "gpu-admission.io/allocation" in p["metadata"].get("annotations", {})]
    assert annotated and len(annotated) < len(pods)
    assert any(p["status"]["phase"] == "Succeeded" for p in pods)
    snap = build_snapshot(objects)
    assert snap.namespace_usage["team-a"].gpus < snap.quotas["team-a"][0].gpus  # type: ignore[operator]
    busy = sum(g.tasks for usage in snap.usage.values() for g in usage.gpus)
    assert busy == 9  # 4 H100 + 1 L4 slice (team-a), 3 A100 (team-b), 1 T4 (sandbox); the finished pod holds none
