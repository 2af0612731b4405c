"""A node that names its GPU model but not its cards' memory (a GPU product label without
nvidia.com/gpu.memory, and no GPUInventory): a whole card is admitted with no memory-limit variable
(HAMi-core reads `0m` as an invalid limit and runs without one, so `0m` only misled), and a memory slice
in MiB, which cannot be checked against such a card, is refused naming the missing label. Through the
webhook (real Flask app and core) and through `gpu-admission check`, which must agree."""

from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient

from webhook.cli import main
from webhook.cluster.translate import build_snapshot
from webhook.server.app import ServerConfig, create_app
from webhook.server.review import decode_patch
from webhook.server.source import StaticSource

LABELS = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "2"}
NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "ml", "labels": {"gpu-admission.io/enabled": "true"}}}


def node(memory_label: bool) -> dict[str, Any]:
    labels = {**LABELS, "nvidia.com/gpu.memory": "81920"} if memory_label else dict(LABELS)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": labels},
            "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "2"}}}


def pod(limits: dict[str, str], env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda:12", "resources": {"limits": limits}}
    if env is not None:
        container["env"] = env
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [container]}}


def review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "ml",
                        "operation": "CREATE", "userInfo": {"username": "alice"}, "object": obj}}


def client(memory_label: bool = False, policy_file: str | None = None) -> FlaskClient:
    source = StaticSource(build_snapshot([node(memory_label), NAMESPACE]))
    return create_app(ServerConfig(source=source, policy_file=policy_file, record_key=b"k" * 32)).test_client()


def answer(c: FlaskClient, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    response = c.post(f"/{endpoint}", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    result: dict[str, Any] = response.get_json()["response"]
    return result


def final_pod(c: FlaskClient, obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The mutation's answer, and the review the validating webhook then gets (patched pod, with a UID)."""
    result = answer(c, "mutate", review(obj))
    assert result["allowed"], result
    final = review(jsonpatch.apply_patch(obj, decode_patch(result)))
    final["request"]["object"]["metadata"]["uid"] = "pod-1"
    final["request"]["dryRun"] = True
    return result, final


def env_of(final: dict[str, Any]) -> list[dict[str, str]]:
    env: list[dict[str, str]] = final["request"]["object"]["spec"]["containers"][0].get("env", [])
    return env


# ------------------------------------------------------------------------------------------- webhook


def test_a_whole_card_of_unknown_memory_gets_no_memory_limit_variable_and_validates() -> None:
    c = client()
    _, final = final_pod(c, pod({"nvidia.com/gpu": "2"}))
    names = [e["name"] for e in env_of(final)]
    assert not [n for n in names if n.startswith("CUDA_DEVICE_MEMORY_LIMIT")], env_of(final)
    assert answer(c, "validate", final)["allowed"]


def test_a_known_card_still_gets_its_memory_limit() -> None:
    _, final = final_pod(client(memory_label=True), pod({"nvidia.com/gpu": "1"}))
    assert {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "81920m"} in env_of(final)


def test_a_zero_limit_written_into_the_final_pod_is_refused_as_a_lifted_limit() -> None:
    c = client()
    _, final = final_pod(c, pod({"nvidia.com/gpu": "1"}))
    lifted = copy.deepcopy(final)
    lifted["request"]["object"]["spec"]["containers"][0]["env"] = [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "0m"}]
    refused = answer(c, "validate", lifted)
    assert refused["allowed"] is False
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" in refused["status"]["message"]


def test_with_mps_a_whole_card_of_unknown_memory_gets_no_pinned_memory_of_zero(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("defaults: {backend: mps}\n")
    c = client(policy_file=str(policy))
    _, final = final_pod(c, pod({"nvidia.com/gpu": "1"}))
    assert not [e for e in env_of(final) if e["name"] == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], env_of(final)
    assert answer(c, "validate", final)["allowed"]


def test_a_memory_slice_in_mib_on_cards_of_unknown_memory_is_refused_naming_the_label() -> None:
    refused = answer(client(), "mutate", review(pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"})))
    assert (refused["allowed"], refused["status"]["code"]) == (False, 422)
    message = refused["status"]["message"]
    assert "nvidia.com/gpu.memory label" in message and "at most 0" not in message


# --------------------------------------------------------------------------------------------- check


@pytest.fixture()
def cluster_file(tmp_path: Path) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [node(False), NAMESPACE]}))
    return str(path)


def check_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", "-o", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def manifest(tmp_path: Path, limits: str) -> str:
    path = tmp_path / "pod.yaml"
    path.write_text(textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: p, namespace: ml}}
        spec:
          containers:
          - name: main
            image: cuda:12
            resources:
              limits: {{{limits}}}
        """))
    return str(path)


def test_check_predicts_no_memory_variable_on_a_card_of_unknown_memory(
    tmp_path: Path, cluster_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = check_json(capsys, "--cluster", cluster_file, manifest(tmp_path, "nvidia.com/gpu: 1"))
    result = report["results"][0]
    assert code == 0 and result["allowed"]
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in json.dumps(result["patch"])
    assert any("nvidia.com/gpu.memory label" in w for w in result["warnings"])
    code = main(["check", "-v", "--cluster", cluster_file, manifest(tmp_path, "nvidia.com/gpu: 1")])
    text = capsys.readouterr().out
    assert code == 0 and '"0m"' not in text and "memory unknown" in text


def test_check_refuses_a_memory_slice_on_cards_of_unknown_memory_as_the_webhook_does(
    tmp_path: Path, cluster_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = check_json(capsys, "--cluster", cluster_file,
                              manifest(tmp_path, "nvidia.com/gpu: 1, nvidia.com/gpumem: 4000"))
    result = report["results"][0]
    assert code == 1 and not result["allowed"] and result["code"] == 422
    assert "nvidia.com/gpu.memory label" in result["message"]
