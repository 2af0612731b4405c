"""The HTTP contract of /mutate, /validate and the probes, through Flask's test client, exact JSON out."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest
from flask.testing import FlaskClient
from server_support import PATCH, Calls, fake_core, gpu_pod_review, make_app

from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Allocation, Snapshot, TopologyClass
from webhook.server.logs import JsonFormatter
from webhook.server.source import StaticSource

V1 = "admission.k8s.io/v1"
ALLOCATION = Allocation(
    node=None,
    gpus=(),
    gpu_count=1,
    memory_mib=81559,
    cores=100,
    vendor="nvidia",
    model="NVIDIA-H100-80GB-HBM3",
    topology=TopologyClass.SINGLE,
    loss=0.0,
    policy="binpack",
)


def client_for(calls: Calls, source: StaticSource | None = None) -> FlaskClient:
    return make_app(fake_core(calls.mutate, calls.validate), source).test_client()


def post(client: FlaskClient, endpoint: str, data: Any, content_type: str = "application/json") -> Any:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return client.post(endpoint, data=raw, content_type=content_type)


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "empty body: expected an AdmissionReview"),
        (b"{not json", "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (
            b'{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview","request":{"uid":"u"}}',
            'unsupported apiVersion "admission.k8s.io/v2": expected admission.k8s.io/v1',
        ),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"Review","request":{"uid":"u"}}',
            'unsupported kind "Review": expected AdmissionReview',
        ),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}',
            "missing request.uid",
        ),
    ],
)
def test_malformed_review_is_400_with_reason(
    endpoint: str, raw: bytes, message: str, coreless_client: FlaskClient
) -> None:
    response = post(coreless_client, endpoint, raw)
    assert response.status_code == 400
    assert response.mimetype == "application/json"
    assert response.get_json() == status_body(400, "BadRequest", message)


def test_body_over_3_mib_is_413(coreless_client: FlaskClient) -> None:
    big = json.dumps({**gpu_pod_review(), "padding": "x" * (3 * 1024 * 1024)}).encode()
    response = post(coreless_client, "/mutate", big)
    assert response.status_code == 413
    assert response.get_json() == status_body(
        413, "RequestEntityTooLarge", f"body of {len(big)} bytes exceeds the limit of 3145728 bytes"
    )


class SilentClient(io.RawIOBase):
    """A request body whose client stops sending: the socket's read times out after a few bytes."""

    def __init__(self) -> None:
        self.sent = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.sent:
            raise TimeoutError("The read operation timed out")
        self.sent = True
        buffer[:1] = b"{"
        return 1


def test_a_body_that_stops_arriving_is_408(coreless_client: FlaskClient) -> None:
    """As gunicorn serves it (`wsgi.input_terminated`): the socket's timeout reaches the app."""
    client = coreless_client
    response = client.post(
        "/validate",
        content_type="application/json",
        environ_overrides={
            "wsgi.input": io.BufferedReader(SilentClient()),
            "wsgi.input_terminated": True,
            "CONTENT_LENGTH": "1000",
        },
    )
    assert response.status_code == 408
    assert response.get_json() == status_body(
        408, "Timeout", "request body not received in full: The read operation timed out"
    )


def test_non_json_content_type_is_415(coreless_client: FlaskClient) -> None:
    response = post(coreless_client, "/validate", gpu_pod_review(), content_type="text/yaml")
    assert response.status_code == 415
    assert response.get_json() == status_body(
        415, "UnsupportedMediaType", "content type must be application/json, got text/yaml"
    )


def test_get_on_admission_endpoint_is_405(coreless_client: FlaskClient) -> None:
    assert coreless_client.get("/mutate").status_code == 405


def fast_path_cases() -> list[tuple[str, dict[str, Any]]]:
    update = gpu_pod_review(uid="f1")
    update["request"]["operation"] = "UPDATE"
    configmap = gpu_pod_review(uid="f2")
    configmap["request"]["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    binding = gpu_pod_review(uid="f3")
    binding["request"]["subResource"] = "binding"
    no_gpu = gpu_pod_review(uid="f4")
    no_gpu["request"]["object"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    mirror = gpu_pod_review(uid="f5")
    mirror["request"]["object"]["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    mirror["request"]["object"]["spec"]["nodeName"] = "n1"  # a kubelet's own static pod (test_record_trust)
    mirror["request"]["userInfo"] = {"username": "system:node:n1", "groups": ["system:nodes"]}
    system = gpu_pod_review(namespace="kube-system", uid="f6")
    own = gpu_pod_review(namespace="gpu-admission", uid="f7")
    delete = gpu_pod_review(uid="f8")
    delete["request"]["operation"] = "DELETE"
    return [
        ("not-create", update),
        ("not-a-pod", configmap),
        ("not-a-pod", binding),
        ("no-gpu-request", no_gpu),
        ("mirror-pod", mirror),
        ("excluded-namespace", system),
        ("excluded-namespace", own),
        ("not-create", delete),
    ]


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
@pytest.mark.parametrize(("reason", "data"), fast_path_cases())
def test_fast_path_allows_unchanged_without_calling_the_core(endpoint: str, reason: str, data: dict[str, Any]) -> None:
    app = make_app(fake_core(Calls(forbid=True).mutate, Calls(forbid=True).validate))
    response = post(app.test_client(), endpoint, data)
    assert response.status_code == 200
    assert response.get_json() == {
        "apiVersion": V1,
        "kind": "AdmissionReview",
        "response": {"uid": data["request"]["uid"], "allowed": True},
    }
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert (
        f'gpu_admission_decisions_total{{endpoint="{endpoint[1:]}",reason="{reason}",verdict="allowed"}} 1.0' in metrics
    )


def test_mutate_answers_a_base64_json_patch_and_passes_policy_and_namespace() -> None:
    calls = Calls(Decision(allowed=True, patch=PATCH, warnings=("near quota",)))
    response = post(client_for(calls), "/mutate", gpu_pod_review(uid="m1"))
    encoded = base64.b64encode(json.dumps(list(PATCH), separators=(",", ":")).encode()).decode()
    assert response.status_code == 200
    assert response.get_json() == {
        "apiVersion": V1,
        "kind": "AdmissionReview",
        "response": {
            "uid": "m1",
            "allowed": True,
            "patch": encoded,
            "patchType": "JSONPatch",
            "warnings": ["near quota"],
        },
    }
    ((kind, pod, policy, namespace),) = calls.seen
    assert (kind, policy, namespace) == ("mutate", "the-policy", "team-a")
    assert pod == gpu_pod_review(uid="m1")["request"]["object"]


def test_validate_never_returns_a_patch() -> None:
    calls = Calls(Decision(allowed=True, patch=PATCH))
    response = post(client_for(calls), "/validate", gpu_pod_review(uid="v1"))
    assert response.get_json() == {
        "apiVersion": V1,
        "kind": "AdmissionReview",
        "response": {"uid": "v1", "allowed": True},
    }
    assert [c[0] for c in calls.seen] == ["validate"]


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_denial_is_http_200_with_status(endpoint: str) -> None:
    decision = Decision(
        allowed=False,
        code=403,
        reason="quota-exceeded",
        message='quota "gpus" in team-a: requests.nvidia.com/gpu used 2, asked 1, limit 2',
    )
    response = post(client_for(Calls(decision)), endpoint, gpu_pod_review(uid="d1"))
    assert response.status_code == 200
    assert response.get_json() == {
        "apiVersion": V1,
        "kind": "AdmissionReview",
        "response": {
            "uid": "d1",
            "allowed": False,
            "status": {
                "code": 403,
                "reason": "quota-exceeded",
                "message": 'quota "gpus" in team-a: requests.nvidia.com/gpu used 2, asked 1, limit 2',
            },
        },
    }


def test_long_warnings_are_truncated() -> None:
    decision = Decision(allowed=True, warnings=("w" * 300,))
    response = post(client_for(Calls(decision)), "/validate", gpu_pod_review(uid="w1"))
    assert response.get_json()["response"]["warnings"] == ["w" * 116 + "..."]


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_unexpected_exception_is_a_500_denial_logged_and_counted(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(*_args: Any, **_kwargs: Any) -> Decision:
        raise KeyError("spec")

    app = make_app(fake_core(boom, boom))
    with caplog.at_level(logging.INFO, logger="webhook.admission"):
        response = post(app.test_client(), endpoint, gpu_pod_review(uid="e1"))
    assert response.status_code == 200
    assert response.get_json() == {
        "apiVersion": V1,
        "kind": "AdmissionReview",
        "response": {
            "uid": "e1",
            "allowed": False,
            "status": {
                "code": 500,
                "reason": "InternalError",
                "message": "internal error in the GPU admission webhook (request uid e1); see its log",
            },
        },
    }
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].uid == "e1" and "KeyError: 'spec'" in JsonFormatter().format(errors[0])
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert f'gpu_admission_errors_total{{endpoint="{endpoint[1:]}"}} 1.0' in metrics
    # The process carries on: the next request is answered normally.
    assert post(app.test_client(), endpoint, {**gpu_pod_review(uid="e2")}).status_code == 200


def test_api_version_is_echoed() -> None:
    data = {**gpu_pod_review(uid="b1"), "apiVersion": "admission.k8s.io/v1beta1"}
    response = post(client_for(Calls(Decision(allowed=True))), "/validate", data)
    assert response.get_json() == {
        "apiVersion": "admission.k8s.io/v1beta1",
        "kind": "AdmissionReview",
        "response": {"uid": "b1", "allowed": True},
    }


@pytest.mark.parametrize("dry_run", [True, False])
def test_dry_run_gets_the_same_answer_and_records_nothing(dry_run: bool) -> None:
    source = StaticSource(Snapshot())
    calls = Calls(Decision(allowed=True, allocation=ALLOCATION))
    data = gpu_pod_review(uid="req-9", pod_uid="pod-9", dry_run=dry_run)
    response = post(client_for(calls, source), "/validate", data)
    assert response.get_json() == {
        "apiVersion": V1,
        "kind": "AdmissionReview",
        "response": {"uid": "req-9", "allowed": True},
    }
    assert source.reservations() == ({} if dry_run else {"pod-9": ("team-a", ALLOCATION)})
    counted = source.snapshot().namespace_usage.get("team-a")
    assert counted is None if dry_run else counted is not None and counted.gpus == 1


def test_reservation_falls_back_to_the_request_uid_without_a_pod_uid() -> None:
    source = StaticSource(Snapshot())
    post(
        client_for(Calls(Decision(allowed=True, allocation=ALLOCATION)), source),
        "/validate",
        gpu_pod_review(uid="req-only"),
    )
    assert list(source.reservations()) == ["req-only"]


def inventory_review(uid: str) -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "operation": "UPDATE",
            "name": "gpu-b",
            "resource": {"group": "gpu-admission.io", "version": "v1alpha1", "resource": "gpuinventories"},
            "userInfo": {
                "username": "system:serviceaccount:gpu-admission:agent",
                "extra": {"authentication.kubernetes.io/node-name": ["gpu-a"]},
            },
            "object": {
                "apiVersion": "gpu-admission.io/v1alpha1",
                "kind": "GPUInventory",
                "metadata": {"name": "gpu-b"},
            },
        },
    }


def test_inventory_writes_go_to_the_guard_on_validate_only() -> None:
    seen: list[Mapping[str, Any]] = []

    def guard(request: Mapping[str, Any]) -> Decision:
        seen.append(request)
        return Decision(allowed=False, code=403, reason="inventory-node-mismatch", message="not your node")

    app = make_app(fake_core(Calls(forbid=True).mutate, Calls(forbid=True).validate, guard))
    response = post(app.test_client(), "/validate", inventory_review("i1"))
    assert response.get_json()["response"] == {
        "uid": "i1",
        "allowed": False,
        "status": {"code": 403, "reason": "inventory-node-mismatch", "message": "not your node"},
    }
    assert seen == [inventory_review("i1")["request"]]
    response = post(app.test_client(), "/mutate", inventory_review("i2"))
    assert response.get_json()["response"] == {"uid": "i2", "allowed": True}
    assert len(seen) == 1


def test_one_json_log_line_per_admission_without_the_object(caplog: pytest.LogCaptureFixture) -> None:
    data = gpu_pod_review(uid="l1", dry_run=True)
    data["request"]["object"]["metadata"] = {"generateName": "train-", "namespace": "team-a"}
    data["request"]["object"]["spec"]["containers"][0]["env"] = [{"name": "TOKEN", "value": "s3cret"}]
    with caplog.at_level(logging.INFO, logger="webhook.admission"):
        post(
            client_for(Calls(Decision(allowed=False, code=422, reason="invalid-quantity", message="m"))),
            "/validate",
            data,
        )
    lines = [JsonFormatter().format(r) for r in caplog.records if r.name == "webhook.admission"]
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert "s3cret" not in lines[0] and "containers" not in lines[0]
    del entry["time"]
    duration = entry.pop("duration_ms")
    assert isinstance(duration, float) and duration >= 0
    assert entry == {
        "level": "info",
        "logger": "webhook.admission",
        "msg": "admission",
        "uid": "l1",
        "namespace": "team-a",
        "pod": "train-",
        "operation": "CREATE",
        "endpoint": "validate",
        "verdict": "denied",
        "reason": "invalid-quantity",
        "code": 422,
        "dry_run": True,
    }


class Unready(StaticSource):
    def ready(self) -> tuple[bool, str]:
        return False, "watch of pods has not listed yet"


def test_probes() -> None:
    client = client_for(Calls())
    health = client.get("/healthz")
    assert (health.status_code, health.get_data(as_text=True)) == (200, "ok\n")
    ready = client.get("/readyz")
    assert (ready.status_code, ready.get_data(as_text=True)) == (200, "ok: static snapshot: 0 nodes, 0 reservations\n")
    unready = client_for(Calls(), Unready(Snapshot())).get("/readyz")
    assert (unready.status_code, unready.get_data(as_text=True)) == (
        503,
        "not ready: watch of pods has not listed yet\n",
    )


def test_metrics_count_requests_by_endpoint_and_result() -> None:
    app = make_app(fake_core(Calls().mutate, Calls(Decision(allowed=False, code=403, reason="policy")).validate))
    client = app.test_client()
    post(client, "/mutate", gpu_pod_review(uid="a"))
    post(client, "/validate", gpu_pod_review(uid="b"))
    post(client, "/validate", b"")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain; version=")
    text = response.get_data(as_text=True)
    for line in (
        'gpu_admission_admission_duration_seconds_count{endpoint="mutate",result="allowed"} 1.0',
        'gpu_admission_admission_duration_seconds_count{endpoint="validate",result="denied"} 1.0',
        'gpu_admission_admission_duration_seconds_count{endpoint="validate",result="rejected"} 1.0',
        'gpu_admission_decisions_total{endpoint="validate",reason="policy",verdict="denied"} 1.0',
        'gpu_admission_bad_requests_total{code="400",endpoint="validate"} 1.0',
        "gpu_admission_requests_in_flight 0.0",
    ):
        assert line in text, line


def test_two_apps_have_independent_registries() -> None:
    first, second = client_for(Calls()), client_for(Calls())
    post(first, "/mutate", gpu_pod_review())
    assert 'endpoint="mutate",result="allowed"} 1.0' in first.get("/metrics").get_data(as_text=True)
    assert 'endpoint="mutate",result="allowed"}' not in second.get("/metrics").get_data(as_text=True)


@pytest.mark.parametrize(
    ("method", "path", "code", "reason"),
    [
        ("GET", "/mutate", 405, "MethodNotAllowed"),
        ("PUT", "/validate", 405, "MethodNotAllowed"),
        ("GET", "/nowhere", 404, "NotFound"),
        ("POST", "/admit", 404, "NotFound"),
    ],
)
def test_unknown_paths_and_wrong_methods_are_answered_as_kubernetes_status(
    coreless_client: FlaskClient, method: str, path: str, code: int, reason: str
) -> None:
    response = coreless_client.open(path, method=method)
    body = response.get_json()
    assert response.status_code == code and response.content_type == "application/json"
    assert (body["kind"], body["status"], body["code"], body["reason"]) == ("Status", "Failure", code, reason)
    assert path in body["message"]
    if code == 405:
        assert "POST" in response.headers["Allow"]
