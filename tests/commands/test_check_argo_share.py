"""`gpu-admission check` gives a KAI share (`gpu-fraction`) to the container KAI's binder gives it to, so
it predicts what the webhook answers a pod Argo creates: `wait` comes first there, and an unnamed share
would reach it instead of the step (`main`)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from webhook.cli import main

CLUSTER = """
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: gpu-1
    labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.memory: "81559", nvidia.com/gpu.count: "8"}
  status:
    allocatable: {cpu: "200", memory: 2000Gi, nvidia.com/gpu: "8"}
- apiVersion: v1
  kind: Namespace
  metadata: {name: ml, labels: {gpu-admission.io/enabled: "true"}}
"""
FIX = "add gpu-fraction-container-name: main to the template's metadata.annotations"
EXECUTOR = "quay.io/argoproj/argoexec:v3.6.4"


def argo_pod(*annotations: str) -> str:
    """A pod as Argo's controller creates it for a container template: init, then wait, then main."""
    lines = "".join(f"\n            {a}" for a in annotations)
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: wf-probe-1
          namespace: ml
          annotations:
            workflows.argoproj.io/node-name: wf.probe
            gpu-fraction: "0.5"{lines}
        spec:
          initContainers:
          - {{name: init, image: "{EXECUTOR}"}}
          containers:
          - {{name: wait, image: "{EXECUTOR}"}}
          - {{name: main, image: registry.example.com/probe:1}}
    """)


def workflow(*annotations: str) -> str:
    lines = "".join(f", {a}" for a in annotations)
    return textwrap.dedent(f"""\
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {{name: probe, namespace: ml}}
        spec:
          entrypoint: probe
          templates:
          - name: probe
            metadata:
              annotations: {{gpu-fraction: "0.5"{lines}}}
            container: {{image: registry.example.com/probe:1}}
    """)


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


def manifest(tmp_path: Path, text: str) -> str:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("text", "kind"), [(argo_pod(), "Pod ml/wf-probe-1: "),
                                            (workflow(), "Workflow ml/probe: probe: ")])
def test_an_unnamed_share_is_refused_in_text(tmp_path: Path, cluster: str, capsys, text: str, kind: str) -> None:
    code, out = check(capsys, "--cluster", cluster, manifest(tmp_path, text))
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith(f"DENY   {kind}422 invalid-annotation: annotations gpu-fraction/gpu-memory give the "
                            "share to the pod's first container, which Argo makes its 'wait' executor")
    assert f"{FIX}  [" in first
    assert out.splitlines()[-1] == "0 allowed, 1 denied, 0 skipped"


@pytest.mark.parametrize("text", [argo_pod(), workflow()])
def test_an_unnamed_share_is_refused_in_json(tmp_path: Path, cluster: str, capsys, text: str) -> None:
    code, out = check(capsys, "--cluster", cluster, "-o", "json", manifest(tmp_path, text))
    assert code == 1
    [result] = json.loads(out)["results"]
    assert (result["allowed"], result["code"], result["reason"]) == (False, 422, "invalid-annotation")
    assert result["message"].endswith(FIX)


def ops_of(result: dict[str, Any]) -> dict[str, Any]:
    return {op["path"]: op["value"] for op in result["patch"]}


def test_a_share_named_for_main_lands_on_main(tmp_path: Path, cluster: str, capsys) -> None:
    path = manifest(tmp_path, argo_pod("gpu-fraction-container-name: main"))
    code, out = check(capsys, "--cluster", cluster, path)
    assert code == 0
    assert out.splitlines()[0] == f"ALLOW  Pod ml/wf-probe-1: node gpu-1, 1 GPU x 40779 MiB/0%, single  [{path}:0]"
    code, out = check(capsys, "--cluster", cluster, "-o", "json", path)
    [result] = json.loads(out)["results"]
    ops = ops_of(result)
    assert ops["/spec/containers/1/resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "40779m"} in ops["/spec/containers/1/env"]
    assert "/spec/containers/0/resources" not in ops  # wait gets no GPU
    assert ops["/spec/containers/0/env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_a_workflow_step_naming_main_is_admitted(tmp_path: Path, cluster: str, capsys) -> None:
    code, out = check(capsys, "--cluster", cluster, "-o", "json",
                      manifest(tmp_path, workflow("gpu-fraction-container-name: main")))
    assert code == 0
    [result] = json.loads(out)["results"]
    assert result["allowed"] is True
    assert (result["allocation"]["gpuCount"], result["allocation"]["memoryMiB"]) == (1, 40779)
