"""`check` with a cluster file that states node pools (a Karpenter NodePool, a Cluster API
MachineDeployment): a pod only a new node can host is admitted to wait, and its -o json allocation
names the pool it waits for (`awaitingPool`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pool_support import fixture, h100_nodepool, training_pod

from webhook.cli import main

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "team-a", "labels": {"gpu-admission.io/enabled": "true"}}}
# The cluster's only GPU node: 4 L4s, none of the H100s the pod selects.
L4_NODE = {"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "l4-0", "labels": {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "4",
                                                   "nvidia.com/gpu.memory": "23034"}},
           "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "48", "memory": "192Gi"}}}


def write(tmp_path: Path, name: str, docs: list[dict[str, Any]]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["check", *args])
    out, _ = capsys.readouterr()
    return code, out


def test_check_admits_the_8_gpu_pod_to_wait_for_the_nodepool_and_names_it(tmp_path: Path, capsys) -> None:
    cluster = write(tmp_path, "cluster.yaml", [NAMESPACE, L4_NODE, h100_nodepool(), *fixture(
        "autoscaler-clusterapi-readme-scale-from-zero.yaml")])
    manifest = write(tmp_path, "pod.yaml", [training_pod(8)])
    code, out = check(capsys, "--cluster", cluster, "-o", "json", manifest)
    (result,) = json.loads(out)["results"]
    assert code == 0 and result["allowed"], result["message"]
    assert any("waits for capacity from NodePool h100" in w for w in result["warnings"])
    assert result["allocation"]["node"] is None
    assert result["allocation"]["awaitingPool"] == "NodePool/h100"
    assert result["reason"] == "awaiting-capacity"  # as the webhook's mutation says it
    code, text = check(capsys, "--cluster", cluster, manifest)
    assert code == 0 and "waits for a new node of NodePool/h100" in text


def test_check_refuses_a_pod_no_pool_of_the_cluster_file_can_host_and_lists_them(tmp_path: Path, capsys) -> None:
    cluster = write(tmp_path, "cluster.yaml", [NAMESPACE, L4_NODE, h100_nodepool(gpu_limit=4), *fixture(
        "autoscaler-clusterapi-readme-scale-from-zero.yaml")])
    manifest = write(tmp_path, "pod.yaml", [training_pod(8)])
    code, out = check(capsys, "--cluster", cluster, "-o", "json", manifest)
    (result,) = json.loads(out)["results"]
    assert code != 0 and not result["allowed"] and result["code"] == 422
    assert "NodePool/h100: its limit nvidia.com/gpu: 4 is used up by its nodes (0), leaving 4" in result["message"]
    assert "MachineDeployment/capi-workload/gpu-workers: its nodes fail the pod's nodeSelector" in result["message"]


def test_a_cluster_that_scales_from_zero_has_pools_and_no_nodes(tmp_path: Path, capsys) -> None:
    # Every GPU node of such a cluster is made on demand: a NodePool alone is a cluster file check reads,
    # and a pod for it waits, with no link figure for a node whose links nobody knows yet.
    cluster = write(tmp_path, "cluster.yaml", [NAMESPACE, h100_nodepool()])
    manifest = write(tmp_path, "pod.yaml", [training_pod(8)])
    code, out = check(capsys, "--cluster", cluster, manifest)
    assert code == 0 and "waits for a new node of NodePool/h100" in out, out
    assert "communication loss" not in out
    empty = write(tmp_path, "namespaces.yaml", [NAMESPACE])
    code = main(["check", "--cluster", empty, manifest])
    assert code == 2 and "no Node objects" in capsys.readouterr().err
