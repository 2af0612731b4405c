"""The wire format: envelope checks with their exact reasons, and the response builders' exact JSON."""

from __future__ import annotations

import base64
import json

import pytest

from webhook.server import review as rv


def body(value: object) -> bytes:
    return json.dumps(value).encode()


def review(**request: object) -> dict[str, object]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u1", **request}}


@pytest.mark.parametrize(
    ("raw", "status", "reason"),
    [
        (b"", 400, "empty body: expected an AdmissionReview"),
        (b"  \n", 400, "empty body: expected an AdmissionReview"),
        (b"{", 400, "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b"[1]", 400, "expected a JSON object (AdmissionReview), got list"),
        (
            body({"kind": "AdmissionReview", "request": {"uid": "u"}}),
            400,
            "unsupported apiVersion (none): expected admission.k8s.io/v1",
        ),
        (
            body({"apiVersion": "v1", "kind": "AdmissionReview", "request": {"uid": "u"}}),
            400,
            'unsupported apiVersion "v1": expected admission.k8s.io/v1',
        ),
        (
            body({"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": {"uid": "u"}}),
            400,
            'unsupported kind "Pod": expected AdmissionReview',
        ),
        (
            body({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            400,
            "missing request: an AdmissionReview must carry a request object",
        ),
        (
            body({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}),
            400,
            "missing request.uid",
        ),
        (
            body({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}}),
            400,
            "missing request.uid",
        ),
        (
            body({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}),
            400,
            "missing request.uid",
        ),
        (b" " * (rv.MAX_BODY_BYTES + 1), 413, "body of 3145729 bytes exceeds the limit of 3145728 bytes"),
    ],
)
def test_malformed_reviews_are_http_errors_with_reasons(raw: bytes, status: int, reason: str) -> None:
    with pytest.raises(rv.ReviewError) as caught:
        rv.parse_review(raw)
    assert (caught.value.http_status, caught.value.reason) == (status, reason)


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_content_types_pass(content_type: str) -> None:
    rv.check_content_type(content_type)


@pytest.mark.parametrize(
    ("content_type", "reason"),
    [
        (None, "content type must be application/json, got none"),
        ("", "content type must be application/json, got none"),
        ("text/plain", "content type must be application/json, got text/plain"),
        ("application/yaml", "content type must be application/json, got application/yaml"),
    ],
)
def test_other_content_types_are_415(content_type: str | None, reason: str) -> None:
    with pytest.raises(rv.ReviewError) as caught:
        rv.check_content_type(content_type)
    assert (caught.value.http_status, caught.value.reason) == (415, reason)


def test_length_over_the_limit_is_413_before_reading() -> None:
    rv.check_length(rv.MAX_BODY_BYTES)
    rv.check_length(None)
    with pytest.raises(rv.ReviewError) as caught:
        rv.check_length(10 * 1024 * 1024)
    assert caught.value.http_status == 413


@pytest.mark.parametrize(
    ("data", "dry_run"),
    [
        (review(dryRun=True), True),
        (review(dryRun=False), False),
        (review(), False),
        ({**review(), "dryRun": True}, True),  # a capture quirk: dryRun at the envelope's top level
        ({**review(dryRun=False), "dryRun": True}, False),  # the request's own field wins
        (review(dryRun="true"), False),  # only a JSON true counts
    ],
)
def test_dry_run_is_read_from_the_request_or_the_envelope(data: dict[str, object], dry_run: bool) -> None:
    assert rv.parse_review(body(data)).dry_run is dry_run


def test_v1beta1_is_accepted_and_remembered() -> None:
    parsed = rv.parse_review(body({**review(), "apiVersion": "admission.k8s.io/v1beta1"}))
    assert parsed.api_version == "admission.k8s.io/v1beta1"
    assert parsed.uid == "u1"


def test_builders_exact_json() -> None:
    assert rv.allowed("u") == {"uid": "u", "allowed": True}
    assert rv.denied("u", 403, "quota gpus exceeded", "quota-exceeded") == {
        "uid": "u",
        "allowed": False,
        "status": {"code": 403, "message": "quota gpus exceeded", "reason": "quota-exceeded"},
    }
    assert rv.errored("u", 500, "boom") == {
        "uid": "u",
        "allowed": False,
        "status": {"code": 500, "message": "boom", "reason": "InternalError"},
    }
    ops = [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    expected_patch = base64.b64encode(b'[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]').decode()
    assert rv.patched("u", ops) == {"uid": "u", "allowed": True, "patch": expected_patch, "patchType": "JSONPatch"}
    assert rv.decode_patch(rv.patched("u", ops)) == ops
    assert rv.patched("u", []) == {"uid": "u", "allowed": True}
    assert rv.envelope("admission.k8s.io/v1", rv.allowed("u")) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u", "allowed": True},
    }


def test_warnings_are_kept_under_120_characters() -> None:
    long = "GPU quota of team-a is at 90 percent " * 5
    response = rv.with_warnings(rv.allowed("u"), ["near the limit", "", long])
    assert response["warnings"][0] == "near the limit"
    assert len(response["warnings"]) == 2
    assert len(response["warnings"][1]) == 119
    assert response["warnings"][1].endswith("...")
    assert long.startswith(response["warnings"][1][:-3])
    assert rv.with_warnings(rv.allowed("u"), []) == {"uid": "u", "allowed": True}
    assert rv.short_warning("two\nlines") == "two lines"
