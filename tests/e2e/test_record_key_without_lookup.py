"""A render that cannot read the cluster (helm template, as GitOps tools render) leaves the record key to the
certificate Job: on the real API server, with the Job's own ServiceAccount and Role as rendered, the command
makes the Secret once, and every later run (each sync runs the hook again) keeps it unchanged."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml
from e2e.controlplane import ControlPlane
from e2e.harness import helm, service_account_token
from e2e_server import cli
from helm_tool import CHART
from kubernetes import client, utils

NAMESPACE = "gitops-render"
FULLNAME = "sync-gpu-admission"


def rendered(plane: ControlPlane) -> list[dict[str, Any]]:
    out = helm(plane, "template", "sync", str(CHART), "--namespace", NAMESPACE,
               "--set", "image.repository=localhost/gpu-admission")
    return [d for d in yaml.safe_load_all(out) if d]


def run_job_command(plane: ControlPlane, job: dict[str, Any], kubeconfig: str) -> subprocess.CompletedProcess[str]:
    args = [a for a in job["spec"]["template"]["spec"]["containers"][0]["args"]
            if a.startswith(("certs", "--namespace", "--record-key-secret", "--service"))]
    return subprocess.run([*cli(), *args, "--kubeconfig", kubeconfig], capture_output=True, text=True, timeout=60)


def test_the_certificate_job_makes_the_key_once_with_its_own_rights(plane: ControlPlane,
                                                                    admin: client.ApiClient) -> None:
    docs = rendered(plane)
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == f"{FULLNAME}-record-key"]
    job = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == f"{FULLNAME}-certs")
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        for doc in docs:
            if doc["kind"] == kind and doc["metadata"]["name"] == account:
                utils.create_from_dict(admin, doc, namespace=NAMESPACE)
    kubeconfig = str(plane.token_kubeconfig(service_account_token(admin, account, NAMESPACE), "certs-hook"))
    first = run_job_command(plane, job, kubeconfig)
    assert first.returncode == 0, first.stderr
    assert "created with a new record key" in first.stderr
    key = core.read_namespaced_secret(f"{FULLNAME}-record-key", NAMESPACE).data["record.key"]
    for _ in range(2):
        again = run_job_command(plane, job, kubeconfig)
        assert again.returncode == 0 and "kept" in again.stderr, again.stderr
    assert core.read_namespaced_secret(f"{FULLNAME}-record-key", NAMESPACE).data["record.key"] == key
    # The Job's rights reach that Secret and the TLS one only: reading any other is refused.
    core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "other"}, "stringData": {"record.key": "x" * 20}})
    other = subprocess.run([*cli(), "certs", "--service", "s", "--namespace", NAMESPACE,
                            "--record-key-secret", "other", "--kubeconfig", kubeconfig],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode != 0 and "403" in other.stderr and "Traceback" not in other.stderr
