"""Our validating webhook judges the pod the API server stores: what another mutating webhook changes
after ours has decided (in the API server's last pass, where ours is not called again) is still judged."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.controlplane import ControlPlane, free_port, spawn, stop_process
from e2e.harness import create_namespace, gpu_container, pod
from kubernetes import client
from kubernetes.client.rest import ApiException

NS = "e2e-later"
# Both sort after the chart's configuration, so the API server calls them after ours in each pass.
CONFIGS = (("zz-injector", "inject"), ("zzz-marker", "mark"))


@pytest.fixture(scope="module")
def core(plane: ControlPlane, admin: client.ApiClient, webhook: Any) -> Iterator[client.CoreV1Api]:
    create_namespace(admin, NS)
    port = free_port()
    server = spawn([sys.executable, str(Path(__file__).with_name("injector.py")), f"127.0.0.1:{port}",
                    str(webhook.cert_dir)], plane.workdir / "injector.log")
    bundle = base64.b64encode((webhook.cert_dir / "ca.crt").read_bytes()).decode()

    def hook(path: str) -> dict[str, Any]:
        return {
            "name": f"{path}.injector.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "timeoutSeconds": 5, "failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/{path}", "caBundle": bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
        }

    registrations = client.AdmissionregistrationV1Api(admin)
    for name, path in CONFIGS:
        registrations.create_mutating_webhook_configuration({"metadata": {"name": name}, "webhooks": [hook(path)]})
    api = client.CoreV1Api(admin)
    try:
        ready_by(api, time.monotonic() + 30)
        yield api
    finally:
        for name, _ in CONFIGS:
            registrations.delete_mutating_webhook_configuration(name)
        stop_process(server)


def ready_by(api: client.CoreV1Api, deadline: float) -> None:
    """The API server calls a new configuration once its informer has it: a dry-run create shows it."""
    while True:
        probe = pod("probe", [{"name": "app", "image": "busybox"}],
                    metadata={"labels": {"injector.example.com/inject": "note"}})
        try:
            stored = api.create_namespaced_pod(NS, probe, dry_run="All")
            if {"injector.example.com/seen", "injector.example.com/marked"} <= set(stored.metadata.annotations or {}):
                return
        except ApiException:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the injector webhook was never called")
        time.sleep(0.3)


def injected(name: str, what: str) -> dict[str, Any]:
    return pod(name, [gpu_container(1)], metadata={"labels": {"injector.example.com/inject": what}})


def test_devices_added_after_our_last_call_are_refused_by_our_validating_webhook(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(NS, injected("widened", "devices"))
    text = json.loads(refused.value.body)["message"]
    assert refused.value.status in (400, 403, 422)
    assert text.startswith('admission webhook "validate-pods.gpu-admission.io" denied the request'), text
    assert "NVIDIA_VISIBLE_DEVICES" in text
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("widened", NS)
    assert missing.value.status == 404


def test_a_harmless_later_change_is_admitted_with_our_decision(core: client.CoreV1Api) -> None:
    stored = core.create_namespaced_pod(NS, injected("noted", "note"))
    annotations = stored.metadata.annotations or {}
    assert annotations.get("injector.example.com/note") == "hello"
    assert "gpu-admission.io/allocation" in annotations
    env = {e.name: e.value for e in stored.spec.containers[0].env or ()}
    assert "NVIDIA_VISIBLE_DEVICES" not in env or env["NVIDIA_VISIBLE_DEVICES"] != "all"
