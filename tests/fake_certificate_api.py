"""An in-memory API for the certificate Secret and the webhook configurations, and the certificate Job's
arguments as the chart passes them."""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch

from webhook.certs.secret import ApiError

NS, SERVICE, SECRET, CONFIG = "gpu-admission", "gpu-gpu-admission", "gpu-gpu-admission-tls", "gpu-gpu-admission"
MUTATING, VALIDATING = "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"



class FakeApi:
    """Secrets and webhook configurations with the API server's concurrency rules; every call recorded."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.configs: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.version = 100
        self.before_write: Callable[[], None] | None = None  # another writer, acting between read and write
        self.fail: dict[str, ApiError] = {}  # verb -> error to raise

    def _next_version(self) -> str:
        self.version += 1
        return str(self.version)

    def _enter(self, verb: str, target: str) -> None:
        self.calls.append((verb, target))
        if verb in self.fail:
            raise self.fail[verb]
        if verb != "read" and self.before_write is not None:
            self.before_write()

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._enter("read", f"Secret {namespace}/{name}")
        found = self.secrets.get((namespace, name))
        return copy.deepcopy(found) if found else None

    def create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        self._enter("create", f"Secret {namespace}/{name}")
        assert body["metadata"]["namespace"] == namespace
        assert "resourceVersion" not in body["metadata"]
        if (namespace, name) in self.secrets:
            raise ApiError(409, f'AlreadyExists: secrets "{name}" already exists')
        self.put_secret(copy.deepcopy(body))

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._enter("replace", f"Secret {namespace}/{name}")
        current = self.secrets.get((namespace, name))
        if current is None:
            raise ApiError(404, "NotFound")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict: the object has been modified")
        if body.get("type") != current.get("type"):
            raise ApiError(422, "Invalid: field is immutable")
        self.put_secret(copy.deepcopy(body))

    def put_secret(self, body: dict[str, Any]) -> None:
        body["metadata"]["resourceVersion"] = self._next_version()
        self.secrets[(body["metadata"]["namespace"], body["metadata"]["name"])] = body

    def read_webhook_configuration(self, kind: str, name: str) -> dict[str, Any] | None:
        self._enter("read", f"{kind} {name}")
        found = self.configs.get((kind, name))
        return copy.deepcopy(found) if found else None

    def patch_webhook_configuration(self, kind: str, name: str, patch: list[dict[str, Any]]) -> None:
        self._enter("patch", f"{kind} {name}")
        try:
            self.configs[(kind, name)] = jsonpatch.apply_patch(self.configs[(kind, name)], patch)
        except jsonpatch.JsonPatchTestFailed as error:
            raise ApiError(422, f"Invalid: {error}") from None

    def secret_files(self) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in self.secrets[(NS, SECRET)]["data"].items()}


def webhook(name: str, service: str = SERVICE, namespace: str = NS, ca_bundle: str | None = None) -> dict[str, Any]:
    client_config: dict[str, Any] = {"service": {"name": service, "namespace": namespace, "path": "/x", "port": 443}}
    if ca_bundle is not None:
        client_config["caBundle"] = ca_bundle
    return {"name": name, "clientConfig": client_config, "sideEffects": "NoneOnDryRun"}


def install_configs(api: FakeApi, ca_bundle: str | None = None) -> None:
    """The chart's two configurations, plus a webhook of another service that must never be touched."""
    api.configs[(MUTATING, CONFIG)] = {
        "metadata": {"name": CONFIG},
        "webhooks": [webhook("mutate-pods.gpu-admission.io", ca_bundle=ca_bundle)],
    }
    api.configs[(VALIDATING, CONFIG)] = {
        "metadata": {"name": CONFIG},
        "webhooks": [
            webhook("validate-pods.gpu-admission.io", ca_bundle=ca_bundle),
            webhook("other.example.com", service="other", ca_bundle="b3RoZXI="),
            webhook("validate-inventories.gpu-admission.io", ca_bundle=ca_bundle),
        ],
    }


def chart_args(out: Path | None = None, *extra: str) -> list[str]:
    """The arguments of the chart's certificate Job (templates/certs-builtin.yaml)."""
    args = [
        f"--service={SERVICE}",
        f"--namespace={NS}",
        "--days=365",
        f"--secret={SECRET}",
        "--renew-before-days=60",
        f"--patch-webhook={CONFIG}",
    ]
    if out is not None:
        args.append(f"--out={out}")
    return args + list(extra)
