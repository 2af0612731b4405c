"""The admission lane (POST /mutate and /validate straight to the handler) answers byte for byte what the
Flask routes behind it answer, and leaves every other request to Flask."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from server_support import Calls, fake_core, gpu_pod_review, make_app
from werkzeug.test import EnvironBuilder

from webhook.server.app import AdmissionLane
from webhook.server.review import MAX_BODY_BYTES


def call(wsgi: Any, environ: dict[str, Any]) -> tuple[str, dict[str, str], bytes]:
    seen: list[Any] = []
    body = b"".join(wsgi(environ, lambda status, headers, exc=None: seen.append((status, headers))))
    status, headers = seen[0]
    return status, dict(headers), body


def environ(method: str, path: str, data: bytes | None, content_type: str | None,
            length: str | None = "auto") -> dict[str, Any]:
    env = EnvironBuilder(path=path, method=method, data=data, content_type=content_type).get_environ()
    if length != "auto":
        env.pop("CONTENT_LENGTH", None)
        if length is not None:
            env["CONTENT_LENGTH"] = length
    return env


def both(method: str, path: str, data: bytes | None, content_type: str | None = "application/json",
         length: str | None = "auto") -> tuple[tuple[str, dict[str, str], bytes], tuple[str, dict[str, str], bytes]]:
    """The same request through the lane and through the Flask app behind it (two apps with equal state)."""
    lane_app, flask_app = (make_app(fake_core(Calls().mutate, Calls().validate)) for _ in range(2))
    lane = lane_app.wsgi_app
    assert isinstance(lane, AdmissionLane)
    behind = flask_app.wsgi_app.inner  # type: ignore[attr-defined]
    return (call(lane, environ(method, path, data, content_type, length)),
            call(behind, environ(method, path, data, content_type, length)))


REVIEW = json.dumps(gpu_pod_review()).encode()
CASES = {
    "mutate": ("POST", "/mutate", REVIEW, "application/json"),
    "validate": ("POST", "/validate", REVIEW, "application/json"),
    "charset in content type": ("POST", "/mutate", REVIEW, "application/json; charset=utf-8"),
    "not JSON": ("POST", "/mutate", b"{not json", "application/json"),
    "wrong content type": ("POST", "/validate", REVIEW, "text/yaml"),
    "no content type": ("POST", "/mutate", REVIEW, None),
    "empty body": ("POST", "/mutate", b"", "application/json"),
    "not a review": ("POST", "/mutate", b'{"kind": "Pod"}', "application/json"),
    "too large": ("POST", "/mutate", b" " * (MAX_BODY_BYTES + 10), "application/json"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lane_answers_as_the_flask_route(case: str) -> None:
    lane, flask = both(*CASES[case])
    assert lane[0] == flask[0]
    assert lane[1]["Content-Type"] == flask[1]["Content-Type"] == "application/json"
    assert lane[1]["Content-Length"] == flask[1]["Content-Length"] == str(len(lane[2]))
    assert json.loads(lane[2]) == json.loads(flask[2])


def test_lane_without_content_length_reads_nothing_as_flask_does() -> None:
    lane, flask = both("POST", "/mutate", REVIEW, "application/json", length=None)
    assert lane[0] == flask[0] == "400 BAD REQUEST"
    assert json.loads(lane[2]) == json.loads(flask[2])


def test_lane_declared_length_over_the_limit_is_413_unread() -> None:
    lane, flask = both("POST", "/mutate", b"{}", "application/json", length=str(MAX_BODY_BYTES * 100))
    assert lane[0] == flask[0] == "413 REQUEST ENTITY TOO LARGE"


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/mutate", "405 METHOD NOT ALLOWED"),
    ("PUT", "/validate", "405 METHOD NOT ALLOWED"),
    ("POST", "/mutate/", "404 NOT FOUND"),
    ("POST", "/mutatex", "404 NOT FOUND"),
    ("GET", "/healthz", "200 OK"),
])
def test_other_requests_go_to_flask(method: str, path: str, status: str) -> None:
    calls = Calls(forbid=True)
    app = make_app(fake_core(calls.mutate, calls.validate))
    got = call(app.wsgi_app, environ(method, path, REVIEW if method != "GET" else None, "application/json"))
    assert got[0] == status


def test_lane_calls_the_core_once_per_admission() -> None:
    calls = Calls()
    app = make_app(fake_core(calls.mutate, calls.validate))
    status, _, body = call(app.wsgi_app, environ("POST", "/mutate", REVIEW, "application/json"))
    assert status == "200 OK"
    assert [kind for kind, *_ in calls.seen] == ["mutate"]
    assert json.loads(body)["response"]["uid"] == gpu_pod_review()["request"]["uid"]


def test_unreadable_body_is_408_through_the_lane() -> None:
    class Broken(io.RawIOBase):
        def readinto(self, b: Any) -> int:
            raise TimeoutError("timed out")

    app = make_app(fake_core(Calls().mutate, Calls().validate))
    env = environ("POST", "/mutate", REVIEW, "application/json")
    env["wsgi.input"] = Broken()
    env["wsgi.input_terminated"] = True  # as gunicorn says: its input stream ends where the body does
    status, _, body = call(app.wsgi_app, env)
    assert status == "408 REQUEST TIMEOUT"
    assert "not received in full" in body.decode()
