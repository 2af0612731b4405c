"""docs/serving.md's AdmissionReview request, answered by the server as the page shows: the same patch, the
same refusal, and a patched pod that validation admits."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient

from webhook.cluster.files import demo_objects
from webhook.cluster.translate import build_snapshot
from webhook.server.app import ServerConfig, create_app
from webhook.server.source import StaticSource

PAGE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def documented() -> list[Any]:
    """The JSON blocks of the page's example, in order: request, answer, decoded patch, refusal."""
    text = PAGE.read_text().split("## One request and its answer", 1)[1]
    return [json.loads(block) for block in re.findall(r"^```json\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]


@pytest.fixture
def client() -> FlaskClient:
    """`gpu-admission serve` with the embedded demo cluster, as the page says."""
    source = StaticSource(build_snapshot(demo_objects()))
    return create_app(ServerConfig(source=source, namespace="gpu-admission")).test_client()


def record(operation: dict[str, Any]) -> dict[str, Any]:
    found = json.loads(operation["value"]["gpu-admission.io/allocation"])
    found.pop("seal")
    return found


def test_the_answer_and_its_patch_are_the_documented_ones(client: FlaskClient) -> None:
    request, answer, patch, _ = documented()
    response = client.post("/mutate", json=request)
    assert response.status_code == 200 and response.content_type == "application/json"
    body = response.get_json()
    got = json.loads(base64.b64decode(body["response"].pop("patch")))
    shown = answer["response"].pop("patch")
    assert shown.endswith("...") and body["response"]["patchType"] == "JSONPatch"
    assert base64.b64encode(json.dumps(got, separators=(",", ":")).encode()).decode().startswith(shown[:-3])
    assert body == answer
    assert [(op["op"], op["path"]) for op in got] == [(op["op"], op["path"]) for op in patch]
    for index in (0, 1, 4):  # env, tolerations, labels: shown whole
        assert got[index] == patch[index]
    affinity, shown_affinity = got[2]["value"]["nodeAffinity"], patch[2]["value"]["nodeAffinity"]
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    preferred = "preferredDuringSchedulingIgnoredDuringExecution"
    assert affinity[required] == shown_affinity[required]
    assert len(affinity[preferred]) == 5 and affinity[preferred][:2] == shown_affinity[preferred]
    assert record(got[3]) == record(patch[3])


def test_the_patched_pod_is_admitted_by_validation(client: FlaskClient) -> None:
    request = documented()[0]
    answer = client.post("/mutate", json=request).get_json()["response"]
    review = copy.deepcopy(request)
    patch = json.loads(base64.b64decode(answer["patch"]))
    review["request"]["object"] = jsonpatch.apply_patch(request["request"]["object"], patch)
    review["request"]["object"]["metadata"]["uid"] = "0c8b5f4e-3f7a-4c1e-9d2b-7a6e5f4d3c2b"
    assert client.post("/validate", json=review).get_json()["response"] == {
        "uid": request["request"]["uid"], "allowed": True
    }


def test_sixteen_gpus_get_the_documented_refusal(client: FlaskClient) -> None:
    request, _, _, refusal = documented()
    limits = request["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/gpu"] = "16"
    assert client.post("/mutate", json=request).get_json() == refusal
