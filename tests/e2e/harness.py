"""The chart installed into the real control plane, and the webhook served beside it on 127.0.0.1.

The API server refuses loopback Endpoints, so the chart's webhook configurations reach the server through
`webhook.url` (the chart's mode for a webhook served outside the cluster). One or more `gpu-admission
serve` replicas listen on that one port with `--reuse-port`, the kernel spreading the API server's
connections over them as a Service's rules would; each also listens on a port of its own, for its
readiness and metrics. Each replica authenticates with a token of the chart's own ServiceAccount: it has
the chart's RBAC and nothing more.
"""

from __future__ import annotations

import copy
import http.client
import os
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from e2e.controlplane import ControlPlane, free_port, spawn, stop_process
from e2e_server import cli, make_certificates
from helm_tool import CHART, find_helm
from kubernetes import client
from kubernetes.client.rest import ApiException

RELEASE = "gpu-admission"
NAMESPACE = "gpu-admission"
DEMO = Path(__file__).resolve().parents[2] / "webhook" / "demo" / "cluster.yaml"
ENABLED = "gpu-admission.io/enabled"


def api_client(kubeconfig: Path) -> client.ApiClient:
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


def helm(plane: ControlPlane, *args: str, timeout: float = 180) -> str:
    done = subprocess.run(
        [str(find_helm()), "--kubeconfig", str(plane.admin_kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={
            **os.environ,
            "HELM_CACHE_HOME": str(plane.workdir / "helm-cache"),
            "HELM_CONFIG_HOME": str(plane.workdir / "helm-config"),
            "HELM_DATA_HOME": str(plane.workdir / "helm-data"),
        },
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


@dataclass
class Replica:
    process: subprocess.Popen[bytes]
    port: int
    log_file: Path

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")


@dataclass
class Webhook:
    """The installed release and the serve replicas behind its URL."""

    plane: ControlPlane
    workdir: Path
    cert_dir: Path
    port: int
    """The port every replica shares, the one in the webhook configurations' URL."""
    kubeconfig: Path
    policy_file: Path
    key_file: Path
    replicas: list[Replica] = field(default_factory=list)
    reservations: str = "api"
    """Where replicas started from now on keep reservations: api (shared ConfigMaps), leader (an elected
    decider keeps them; the others forward to it) or memory (one replica)."""

    def start_replica(self, timeout: float = 60.0) -> Replica:
        port = free_port()
        log_file = self.workdir / f"serve-{port}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPU_ADMISSION_RECORD_KEY_FILE": str(self.key_file)}
        env.pop("POD_NAMESPACE", None)
        command = [*cli(), "serve", "--kubeconfig", str(self.kubeconfig), "--cert-dir", str(self.cert_dir)]
        command += ["--bind", f"127.0.0.1:{self.port}", "--bind", f"127.0.0.1:{port}", "--reuse-port"]
        command += ["--namespace", NAMESPACE, "--policy", str(self.policy_file)]
        command += ["--reservations", self.reservations, "--log-level", "warning"]
        if self.reservations == "leader":  # the others forward reviews to it at its own port
            command += ["--peer-url", f"https://127.0.0.1:{port}"]
        command += ["--client-ca", str(self.plane.ca_file)]  # only the API server's client certificate
        process = spawn(command, log_file, env=env, cwd=self.workdir)
        replica = Replica(process, port, log_file)
        self._wait_ready(replica, timeout)
        self.replicas.append(replica)
        return replica

    def stop_replica(self, replica: Replica) -> None:
        self.replicas.remove(replica)
        stop_process(replica.process)

    def scale(self, count: int, reservations: str | None = None) -> None:
        """`count` replicas; with `reservations`, all keeping them there (restarted when that changes)."""
        if reservations is not None and reservations != self.reservations:
            while self.replicas:
                self.stop_replica(self.replicas[-1])
            self.reservations = reservations
        while len(self.replicas) > count:
            self.stop_replica(self.replicas[-1])
        while len(self.replicas) < count:
            self.start_replica()

    def _wait_ready(self, replica: Replica, timeout: float) -> None:
        context = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
        deadline = time.monotonic() + timeout
        while True:
            if replica.process.poll() is not None:
                raise RuntimeError(f"serve exited {replica.process.returncode}:\n{replica.log()[-4000:]}")
            conn = http.client.HTTPSConnection("127.0.0.1", replica.port, context=context, timeout=2)
            try:
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            if time.monotonic() > deadline:
                stop_process(replica.process)
                raise RuntimeError(f"serve not ready in {timeout:.0f} s:\n{replica.log()[-4000:]}")
            time.sleep(0.2)

    def metrics(self, replicas: list[Replica] | None = None) -> str:
        """The /metrics text of these replicas (default: every one), concatenated. Right after a burst a
        replica may take a while to accept another connection on 2 loaded cores: waited for, not failed."""
        context = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
        texts = []
        for replica in self.replicas if replicas is None else replicas:
            for attempt in range(3):
                conn = http.client.HTTPSConnection("127.0.0.1", replica.port, context=context, timeout=30)
                try:
                    conn.request("GET", "/metrics")
                    texts.append(conn.getresponse().read().decode())
                    break
                except (OSError, http.client.HTTPException):
                    if attempt == 2:
                        raise
                finally:
                    conn.close()
        return "\n".join(texts)

    def set_policy(self, policy: dict[str, Any]) -> None:
        """Writes the policy file every replica reads, and waits until each has reloaded it."""
        self.policy_file.write_text(yaml.safe_dump(policy))
        time.sleep(2.5)

    def stop(self) -> None:
        for replica in list(self.replicas):
            self.stop_replica(replica)


def service_account_token(api: client.ApiClient, name: str, namespace: str, seconds: int = 86400) -> str:
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
    )
    answer = client.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, request)
    return str(answer.status.token)


def install(plane: ControlPlane, api: client.ApiClient, values: dict[str, Any], replicas: int = 1) -> Webhook:
    """helm install of the chart with the webhook served at one shared port; `replicas` serve processes."""
    workdir = plane.workdir / "webhook"
    cert_dir = workdir / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca_bundle = make_certificates(cert_dir, service=RELEASE, namespace=NAMESPACE)
    port = free_port()
    chart_values = copy.deepcopy(values)
    chart_values.setdefault("webhook", {}).update({"url": f"https://127.0.0.1:{port}", "reservations": "api"})
    chart_values["certificates"] = {"mode": "existingSecret", "existingSecret": {"caBundle": ca_bundle}}
    chart_values.setdefault("image", {"repository": "localhost/gpu-admission"})  # the agent's; no kubelet pulls it
    values_file = workdir / "values.yaml"
    values_file.write_text(yaml.safe_dump(chart_values))
    helm(
        plane,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--values",
        str(values_file),
        "--wait=false",
    )
    core = client.CoreV1Api(api)
    policy = core.read_namespaced_config_map(f"{RELEASE}-policy", NAMESPACE).data["policy.yaml"]
    policy_file = workdir / "policy.yaml"
    policy_file.write_text(policy)
    import base64

    key = core.read_namespaced_secret(f"{RELEASE}-record-key", NAMESPACE).data["record.key"]
    key_file = workdir / "record.key"
    key_file.write_bytes(base64.b64decode(key))
    key_file.chmod(0o600)
    token = service_account_token(api, RELEASE, NAMESPACE)
    webhook = Webhook(
        plane, workdir, cert_dir, port, plane.token_kubeconfig(token, "webhook-sa"), policy_file, key_file
    )
    for _ in range(replicas):
        webhook.start_replica()
    return webhook


def demo_objects(kind: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(DEMO.read_text()) if d and d.get("kind") == kind]


def create_node(api: client.ApiClient, node: dict[str, Any]) -> None:
    """A Node as a kubelet would leave it: labels, then status (Ready, capacity), then its taints (the
    TaintNodesByCondition plugin adds not-ready at create; a kubelet's Ready status lifts it)."""
    core = client.CoreV1Api(api)
    meta = node["metadata"]
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": meta["name"], "labels": meta.get("labels", {})}}
    core.create_node(body)
    status = copy.deepcopy(node.get("status", {}))
    status["conditions"] = [
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "e2e",
            "lastHeartbeatTime": _now(),
            "lastTransitionTime": _now(),
        }
    ]
    core.patch_node_status(meta["name"], {"status": status})
    core.patch_node(meta["name"], {"spec": {"taints": node.get("spec", {}).get("taints") or None}})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def create_inventory(api: client.ApiClient, inventory: dict[str, Any]) -> None:
    body = copy.deepcopy(inventory)
    body["metadata"] = {"name": inventory["metadata"]["name"], "labels": inventory["metadata"].get("labels", {})}
    client.CustomObjectsApi(api).create_cluster_custom_object("gpu-admission.io", "v1alpha1", "gpuinventories", body)


def create_namespace(api: client.ApiClient, name: str, managed: bool = True, timeout: float = 30) -> None:
    """A namespace (opted in unless `managed` is False), once the controller-manager made its default
    ServiceAccount (pods are refused until then)."""
    labels = {ENABLED: "true"} if managed else {}
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except ApiException as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    metadata = spec.pop("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {"containers": containers, **spec},
    }


def gpu_container(gpus: int = 1, name: str = "main", **resources: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus), **resources}
    return {"name": name, "image": "nvcr.io/nvidia/pytorch:24.05-py3", "resources": {"limits": limits}}


def iter_pods(api: client.ApiClient, namespace: str) -> Iterator[Any]:
    yield from client.CoreV1Api(api).list_namespaced_pod(namespace).items
