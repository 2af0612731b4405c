"""Fuzzing the admission endpoints with the real core: every answer is a well-formed review or a 4xx.

Random bytes, truncated and mutated real reviews, absurd quantities and huge pods. No answer is a
5xx, none is a denial from an internal error (which would mean the core crashed), none takes long.
"""

from __future__ import annotations

import base64
import copy
import json
from datetime import timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_support import FIXTURE_FILES, cluster_objects, fixture_review, gpu_pod_review, with_gpu

from webhook.cluster.translate import build_snapshot
from webhook.server.app import ServerConfig, create_app
from webhook.server.source import StaticSource

FUZZ = settings(
    max_examples=60, deadline=timedelta(seconds=5), suppress_health_check=[HealthCheck.too_slow], database=None
)
REVIEWS = [with_gpu(fixture_review(name), 2) for name in FIXTURE_FILES]


@pytest.fixture(scope="module")
def client() -> FlaskClient:
    source = StaticSource(build_snapshot(cluster_objects(quota_gpus=1_000_000)))
    return create_app(ServerConfig(source=source, namespace="gpu-admission")).test_client()


def check_answer(client: FlaskClient, endpoint: str, body: bytes) -> dict[str, Any] | None:
    """Posts; asserts the answer is a 4xx Status or a well-formed review; returns the response part."""
    answer = client.post(endpoint, data=body, content_type="application/json")
    payload = json.loads(answer.get_data())
    if answer.status_code != 200:
        assert answer.status_code in (400, 413), (answer.status_code, payload)
        assert payload["kind"] == "Status" and payload["code"] == answer.status_code and payload["message"]
        return None
    sent = json.loads(body)
    assert payload["apiVersion"] == sent["apiVersion"] and payload["kind"] == "AdmissionReview"
    response = payload["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if response["allowed"]:
        assert "status" not in response
    else:
        status = response["status"]
        assert status["code"] != 500, f"internal error for {endpoint}: {status}"
        assert 400 <= status["code"] < 500 and status["message"] and status["reason"]
    if "patch" in response:
        assert endpoint == "/mutate" and response["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(response["patch"]))
        assert isinstance(ops, list) and all(op["op"] in ("add", "remove", "replace") for op in ops)
    assert all(isinstance(w, str) and len(w) < 120 for w in response.get("warnings", []))
    return dict(response)


endpoints = st.sampled_from(["/mutate", "/validate"])


@FUZZ
@given(endpoint=endpoints, body=st.binary(max_size=2048))
def test_random_bytes(client: FlaskClient, endpoint: str, body: bytes) -> None:
    answer = client.post(endpoint, data=body, content_type="application/json")
    assert answer.status_code in (200, 400)


@FUZZ
@given(endpoint=endpoints, review=st.sampled_from(REVIEWS), cut=st.floats(0.0, 0.999))
def test_truncated_reviews(client: FlaskClient, endpoint: str, review: dict[str, Any], cut: float) -> None:
    raw = json.dumps(review).encode()
    answer = client.post(endpoint, data=raw[: int(len(raw) * cut)], content_type="application/json")
    assert answer.status_code == 400
    assert json.loads(answer.get_data())["code"] == 400


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths_of(item, (*prefix, index))
    return found


@FUZZ
@given(endpoint=endpoints, data=st.data())
def test_mutated_reviews(client: FlaskClient, endpoint: str, data: st.DataObject) -> None:
    review = copy.deepcopy(data.draw(st.sampled_from(REVIEWS)))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths_of(review["request"])))
        if not path:
            continue
        parent = review["request"]
        for step in path[:-1]:
            parent = parent[step]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(json_values)
    check_answer(client, endpoint, json.dumps(review).encode())


quantities = st.one_of(
    st.sampled_from(
        [
            "1e308",
            "-5",
            "0",
            "0.5",
            "99999999999999999999Ei",
            "NaN",
            "Infinity",
            "1/2",
            "",
            " 2 ",
            "1Ki",
            "3m",
            "2.5",
            "1e-9",
            "0x10",
            "١",
            "+1",
            "1_000",
            "-0",
        ]
    ),
    st.integers(-(2**70), 2**70).map(str),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
GPU_KEYS = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "hygon.com/dcunum",
    "cambricon.com/vmlu",
    "cpu",
    "memory",
]


@FUZZ
@given(
    endpoint=endpoints,
    limits=st.dictionaries(st.sampled_from(GPU_KEYS), quantities, min_size=1, max_size=4),
    use_requests=st.booleans(),
    annotation=st.none() | quantities,
)
def test_absurd_quantities(
    client: FlaskClient, endpoint: str, limits: dict[str, Any], use_requests: bool, annotation: Any
) -> None:
    review = gpu_pod_review(uid="q")
    resources = review["request"]["object"]["spec"]["containers"][0]["resources"]
    resources["limits"] = limits
    if use_requests:
        resources["requests"] = dict(limits)
    if annotation is not None:
        review["request"]["object"]["metadata"]["annotations"] = {
            "gpu-fraction": annotation,
            "volcano.sh/vgpu-number": annotation,
        }
    check_answer(client, endpoint, json.dumps(review).encode())


@settings(max_examples=8, deadline=timedelta(seconds=10), database=None)
@given(endpoint=endpoints, containers=st.integers(100, 1500), name_length=st.integers(1, 5000))
def test_huge_pods(client: FlaskClient, endpoint: str, containers: int, name_length: int) -> None:
    review = gpu_pod_review(uid="huge")
    spec = review["request"]["object"]["spec"]
    spec["containers"] = [
        {
            "name": f"c{i}-" + "x" * min(name_length, 50),
            "image": "cuda",
            "env": [{"name": f"E{j}", "value": "v" * 20} for j in range(5)],
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}},
        }
        for i in range(containers)
    ]
    review["request"]["object"]["metadata"]["annotations"] = {"note": "n" * name_length}
    body = json.dumps(review).encode()
    assert len(body) < 3 * 1024 * 1024
    check_answer(client, endpoint, body)
