"""AdmissionReview on the wire: typed shapes, parsing with HTTP errors, and the response builders.

The builders are named after controller-runtime's (allowed, denied, patched, errored, with_warnings) so
that a reader who knows one admission library knows this one. Everything here is a pure function of
its inputs: the Flask layer only moves bytes in and out.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict

from webhook.core.domain.decision import MAX_WARNING

from . import jsoncodec

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server itself caps objects at 3 MiB


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class AdmissionRequest(TypedDict):
    uid: str
    kind: NotRequired[GroupVersionKind]
    resource: NotRequired[GroupVersionResource]
    subResource: NotRequired[str]
    requestKind: NotRequired[GroupVersionKind]
    requestResource: NotRequired[GroupVersionResource]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: NotRequired[Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]]
    userInfo: NotRequired[UserInfo]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]
    options: NotRequired[dict[str, Any] | None]


class Status(TypedDict):
    code: int
    message: str
    reason: str


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patch: NotRequired[str]
    patchType: NotRequired[Literal["JSONPatch"]]
    warnings: NotRequired[list[str]]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    request: NotRequired[AdmissionRequest]
    response: NotRequired[AdmissionResponse]


class ReviewError(Exception):
    """A malformed HTTP request or review: answered with this HTTP status and reason, never a review."""

    def __init__(self, http_status: int, reason: str) -> None:
        super().__init__(reason)
        self.http_status = http_status
        self.reason = reason


class IncomingReview(NamedTuple):
    """A review that passed the envelope checks: what the handlers need, nothing decided yet. A named
    tuple, like the handler's other per-request values: a frozen dataclass costs several times more to make."""

    api_version: str
    request: AdmissionRequest
    dry_run: bool

    @property
    def uid(self) -> str:
        return self.request["uid"]


def check_content_type(content_type: str | None) -> None:
    """415 unless the body is declared JSON (parameters such as charset are fine)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        shown = content_type if content_type else "none"
        raise ReviewError(415, f"content type must be application/json, got {shown}")


def check_length(length: int | None) -> None:
    """413 for a body over the limit (checked on Content-Length before reading, and on what was read)."""
    if length is not None and length > MAX_BODY_BYTES:
        raise ReviewError(413, f"body of {length} bytes exceeds the limit of {MAX_BODY_BYTES} bytes")


def parse_review(body: bytes) -> IncomingReview:
    """The envelope checks: each failure is a 400 (or 413) with a reason the API server logs."""
    check_length(len(body))
    if not body.strip():
        raise ReviewError(400, "empty body: expected an AdmissionReview")
    try:
        data = jsoncodec.loads(body)
    except (ValueError, RecursionError) as err:
        raise ReviewError(400, f"invalid JSON: {_one_line(err)}") from None
    if not isinstance(data, dict):
        raise ReviewError(400, f"expected a JSON object (AdmissionReview), got {type(data).__name__}")
    api_version = data.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(400, f"unsupported apiVersion {_shown(api_version)}: expected admission.k8s.io/v1")
    if data.get("kind") != "AdmissionReview":
        raise ReviewError(400, f"unsupported kind {_shown(data.get('kind'))}: expected AdmissionReview")
    request = data.get("request")
    if not isinstance(request, dict):
        raise ReviewError(400, "missing request: an AdmissionReview must carry a request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(400, "missing request.uid")
    # dryRun belongs in the request; some captures carry it at the envelope's top level.
    dry_run = request.get("dryRun", data.get("dryRun", False)) is True
    return IncomingReview(api_version=str(api_version), request=request, dry_run=dry_run)  # type: ignore[arg-type]


def allowed(uid: str) -> AdmissionResponse:
    return {"uid": uid, "allowed": True}


def denied(uid: str, code: int, message: str, reason: str) -> AdmissionResponse:
    return {"uid": uid, "allowed": False, "status": {"code": code, "message": message, "reason": reason}}


def patched(uid: str, patch: Iterable[Mapping[str, Any]]) -> AdmissionResponse:
    """Allowed with a JSONPatch; an empty patch is a plain `allowed` (no patch field at all)."""
    ops = [op if type(op) is dict else dict(op) for op in patch]  # the JSON encoder wants dicts
    if not ops:
        return allowed(uid)
    # binascii keeps the GIL: an encoder that releases it (as SIMD ones do) hands it to another of the
    # worker's threads mid-request, and the request then waits for it back.
    encoded = binascii.b2a_base64(jsoncodec.dumps(ops), newline=False).decode("ascii")
    return {"uid": uid, "allowed": True, "patch": encoded, "patchType": "JSONPatch"}


def errored(uid: str, code: int, message: str) -> AdmissionResponse:
    """The answer to an unexpected failure: a denial, so a GPU pod never escapes its limits."""
    return denied(uid, code, message, "InternalError")


def with_warnings(response: AdmissionResponse, warnings: Iterable[str]) -> AdmissionResponse:
    """The response plus warnings, each kept under 120 characters (the API server's advice)."""
    if not warnings:
        return response
    kept = [short_warning(w) for w in warnings if w]
    if not kept:
        return response
    result: AdmissionResponse = {**response}
    result["warnings"] = [*response.get("warnings", []), *kept]
    return result


def short_warning(text: str) -> str:
    text = " ".join(str(text).split())
    if len(text) <= MAX_WARNING:
        return text
    return text[: MAX_WARNING - 3].rstrip() + "..."


def envelope(api_version: str, response: AdmissionResponse) -> AdmissionReview:
    """The review that goes back, in the version that came in."""
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def decode_patch(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch operations of a response (empty when it has none); for tests and tools."""
    encoded = response.get("patch")
    if not encoded:
        return []
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(encoded))
    return ops


def _shown(value: Any) -> str:
    text = json.dumps(value) if value is not None else "(none)"
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:200]
