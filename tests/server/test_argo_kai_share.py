"""The webhook gives a KAI share (`gpu-fraction`, `gpu-memory`) to the container KAI's binder gives it
to: the one `gpu-fraction-container-name` names, else spec.containers[0]. In a pod Argo creates the
first container is Argo's `wait` executor, so an unnamed share is refused, naming the annotation that
gives it to the step (`main`)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from flask.testing import FlaskClient

EXECUTOR = "quay.io/argoproj/argoexec:v3.6.4"
FIX = "add gpu-fraction-container-name: main to the template's metadata.annotations"


def argo_review(annotations: dict[str, str], first: str = "wait") -> dict[str, Any]:
    """A CREATE review of a pod as Argo's controller builds it for a container template."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "wf-probe-1", "namespace": "team-a",
                     "annotations": {"workflows.argoproj.io/node-name": "wf.probe", **annotations}},
        "spec": {
            "initContainers": [{"name": "init", "image": EXECUTOR}],
            "containers": [{"name": first, "image": EXECUTOR},
                           {"name": "main", "image": "registry.example.com/probe:1"}],
        },
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "r-argo", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team-a",
        "operation": "CREATE", "userInfo": {"username": "system:serviceaccount:argo:argo"}, "object": pod}}


def post(client: FlaskClient, endpoint: str, review: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(endpoint, data=json.dumps(review), content_type="application/json")
    assert answer.status_code == 200, answer.get_data(as_text=True)
    response: dict[str, Any] = json.loads(answer.get_data())["response"]
    assert response["uid"] == "r-argo"
    return response


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
@pytest.mark.parametrize("share", [{"gpu-fraction": "0.5"}, {"gpu-memory": "4000"}])
@pytest.mark.parametrize("executor", ["wait", "supervisor"])
def test_an_unnamed_share_in_an_argo_pod_is_refused_naming_the_fix(
    live_client: FlaskClient, endpoint: str, share: dict[str, str], executor: str
) -> None:
    response = post(live_client, endpoint, argo_review(share, executor))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    message = response["status"]["message"]
    assert f"Argo makes its {executor!r} executor, so the step ('main') would get no GPU" in message
    assert message.endswith(FIX)
    assert "patch" not in response


def test_a_share_named_for_main_lands_on_main_and_wait_gets_no_gpu(live_client: FlaskClient) -> None:
    response = post(live_client, "/mutate",
                    argo_review({"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"}))
    assert response["allowed"] is True, response
    ops = {op["path"]: op["value"] for op in json.loads(base64.b64decode(response["patch"]))}
    assert ops["/spec/containers/1/resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    main_env = {e["name"]: e["value"] for e in ops["/spec/containers/1/env"]}
    assert main_env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{81559 // 2}m"
    assert "/spec/containers/0/resources" not in ops  # wait: no GPU, and nothing it could see one through
    assert ops["/spec/containers/0/env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    allocation = json.loads(ops["/metadata/annotations/gpu-admission.io~1allocation"])
    assert (allocation["gpuCount"], allocation["memoryMiB"]) == (1, 81559 // 2)


def test_a_pod_that_is_not_argos_keeps_kais_default(live_client: FlaskClient) -> None:
    """Without Argo's node-name annotation a first container named `wait` is just the first container."""
    review = argo_review({"gpu-fraction": "0.5"})
    del review["request"]["object"]["metadata"]["annotations"]["workflows.argoproj.io/node-name"]
    response = post(live_client, "/mutate", review)
    assert response["allowed"] is True, response
    ops = {op["path"]: op["value"] for op in json.loads(base64.b64decode(response["patch"]))}
    assert ops["/spec/containers/0/resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert "/spec/containers/1/resources" not in ops
