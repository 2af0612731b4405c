"""`gpu-admission certs --secret --patch-webhook` through the real kubernetes client, over HTTP.

No API server runs: a local HTTP stub answers the REST paths the command must call (Secret read,
create and replace; webhook configuration read and JSON patch) from the same `FakeApi` the logic tests
use. This checks what the fake cannot: the URLs, verbs, content types and bodies the client sends.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_certificate_api import CONFIG, MUTATING, NS, SECRET, VALIDATING, FakeApi, chart_args, install_configs

from webhook import cli
from webhook.certs.secret import ApiError

SECRET_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?$")
CONFIG_PATH = re.compile(
    r"^/apis/admissionregistration\.k8s\.io/v1/(mutating|validating)webhookconfigurations/([^/]+)$"
)
KINDS = {"mutating": MUTATING, "validating": VALIDATING}


class Stub(BaseHTTPRequestHandler):
    api: FakeApi
    seen: list[tuple[str, str, str]]  # method, path, content type
    forbid: bool = False

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        path = self.path.split("?")[0]
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        Stub.seen.append((method, path, self.headers.get("Content-Type") or ""))
        if Stub.forbid:
            self._status(403, "Forbidden", f'secrets "{SECRET}" is forbidden: User "system:anonymous" cannot get')
            return
        try:
            found = self._call(method, path, body)
        except ApiError as error:
            reason, _, message = error.reason.partition(": ")
            self._status(error.status, reason, message or reason)
            return
        if found is None and method == "GET":
            self._status(404, "NotFound", "not found")
            return
        self._send(200, found or {})

    def _call(self, method: str, path: str, body: Any) -> Any:
        api = Stub.api
        secret = SECRET_PATH.match(path)
        if secret and method == "GET":
            return api.read_secret(secret[1], secret[2])
        if secret and method == "POST" and secret[2] is None:
            api.create_secret(secret[1], body)
            return body
        if secret and method == "PUT":
            api.replace_secret(secret[1], secret[2], body)
            return body
        config = CONFIG_PATH.match(path)
        if config and method == "GET":
            return api.read_webhook_configuration(KINDS[config[1]], config[2])
        if config and method == "PATCH":
            api.patch_webhook_configuration(KINDS[config[1]], config[2], body)
            return api.configs[(KINDS[config[1]], config[2])]
        raise AssertionError(f"unexpected call {method} {path}")

    def _status(self, code: int, reason: str, message: str) -> None:
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
        self._send(code, {**status, "reason": reason, "message": message})

    def _send(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def kubeconfig_for(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stub", "cluster": {"server": server}}],
                "users": [{"name": "job", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "job"}}],
                "current-context": "stub",
            }
        )
    )
    return str(path)


@pytest.fixture()
def stub(tmp_path: Path) -> Iterator[tuple[FakeApi, str]]:
    Stub.api, Stub.seen, Stub.forbid = FakeApi(), [], False
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield Stub.api, kubeconfig_for(tmp_path, f"http://127.0.0.1:{server.server_port}")
    server.shutdown()
    server.server_close()


def test_install_then_post_install_over_http(
    stub: tuple[FakeApi, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api, kubeconfig = stub
    assert cli.main(["certs", *chart_args(tmp_path / "out"), f"--kubeconfig={kubeconfig}"]) == 0
    install_configs(api)
    assert cli.main(["certs", *chart_args(), f"--kubeconfig={kubeconfig}"]) == 0
    secret_url = f"/api/v1/namespaces/{NS}/secrets"
    configs = "/apis/admissionregistration.k8s.io/v1/"
    assert [(method, path) for method, path, _ in Stub.seen] == [
        ("GET", f"{secret_url}/{SECRET}"),
        ("POST", secret_url),
        ("GET", f"{configs}mutatingwebhookconfigurations/{CONFIG}"),
        ("GET", f"{configs}validatingwebhookconfigurations/{CONFIG}"),
        ("GET", f"{secret_url}/{SECRET}"),
        ("GET", f"{configs}mutatingwebhookconfigurations/{CONFIG}"),
        ("PATCH", f"{configs}mutatingwebhookconfigurations/{CONFIG}"),
        ("GET", f"{configs}validatingwebhookconfigurations/{CONFIG}"),
        ("PATCH", f"{configs}validatingwebhookconfigurations/{CONFIG}"),
    ]
    # A list body must go as a JSON patch (the API server reads a missing content type as JSON).
    assert {ctype for method, _, ctype in Stub.seen if method == "PATCH"} == {"application/json-patch+json"}
    files = api.secret_files()
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == files
    bundle = base64.b64encode(files["ca.crt"]).decode()
    assert capsys.readouterr().out == f"{bundle}\n{bundle}\n"
    assert api.configs[(MUTATING, CONFIG)]["webhooks"][0]["clientConfig"]["caBundle"] == bundle
    assert api.secrets[(NS, SECRET)]["type"] == "kubernetes.io/tls"


def test_a_conflict_over_http_is_retried(stub: tuple[FakeApi, str], capsys: pytest.CaptureFixture[str]) -> None:
    api, kubeconfig = stub
    assert cli.main(["certs", *chart_args(), "--days=30", "--renew-before-days=29", f"--kubeconfig={kubeconfig}"]) == 0
    bumped: list[bool] = []

    def concurrent_update() -> None:
        if not bumped:
            bumped.append(True)
            api.put_secret(api.secrets[(NS, SECRET)])

    api.before_write = concurrent_update
    Stub.seen.clear()
    # 30-day certificate, renewed when 31 days or fewer remain: due now.
    assert cli.main(["certs", *chart_args(), "--days=40", "--renew-before-days=31", f"--kubeconfig={kubeconfig}"]) == 0
    assert [method for method, path, _ in Stub.seen if "secrets" in path] == ["GET", "PUT", "GET", "PUT"]
    assert "(409 Conflict); reading it again" in capsys.readouterr().err


def test_a_refusal_over_http_is_one_line(stub: tuple[FakeApi, str], capsys: pytest.CaptureFixture[str]) -> None:
    _api, kubeconfig = stub
    Stub.forbid = True
    assert cli.main(["certs", *chart_args(), f"--kubeconfig={kubeconfig}"]) == 2
    assert capsys.readouterr().err == (
        f"gpu-admission certs: error: secret {NS}/{SECRET}: cannot read: HTTP 403 Forbidden: "
        f'secrets "{SECRET}" is forbidden: User "system:anonymous" cannot get\n'
    )


def test_an_unreachable_api_server_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    kubeconfig = kubeconfig_for(tmp_path, f"http://127.0.0.1:{port}")
    assert cli.main(["certs", *chart_args(), f"--kubeconfig={kubeconfig}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"gpu-admission certs: error: secret {NS}/{SECRET}: cannot read: cannot reach the API server: "
    )
