"""Shared helpers of the server tests: a small cluster, GPU copies of the review fixtures, a fake core."""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from webhook.cluster.translate import build_snapshot
from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Snapshot
from webhook.policyfile.holder import PolicyHolder
from webhook.server.admission import AdmissionCore
from webhook.server.app import ServerConfig, create_app
from webhook.server.metrics import AdmissionMetrics
from webhook.server.source import StaticSource

# AdmissionReview bodies: public captures and hand-built ones (tests/fixtures/admissionreview/README.md).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "admissionreview"

FIXTURE_FILES = (
    "pod-create-kubectl-mutating-phase.appscope.json",
    "pod-create-replicaset-controller-eks.connaisseur.json",
    "pod-create-kubectl-validating-phase.request-only.kubewarden.json",
    "pod-create-docs-example.kyverno-docs.json",
)
MANAGED_NAMESPACES = ("default", "foo", "test-connaisseur", "team-a")
H100 = "NVIDIA-H100-80GB-HBM3"


def fixture_review(name: str) -> dict[str, Any]:
    """A fixture as a full AdmissionReview (the request-only one wrapped)."""
    data = json.loads((FIXTURES / name).read_text())
    if "request" not in data:
        data = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": data}
    return data


def with_gpu(review: Mapping[str, Any], gpus: int = 1, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A copy whose first container asks for `gpus` nvidia.com/gpu (plus any `extra` limits)."""
    result = copy.deepcopy(dict(review))
    container = result["request"]["object"]["spec"]["containers"][0]
    resources = container.setdefault("resources", {})
    limits = resources.setdefault("limits", {})
    limits["nvidia.com/gpu"] = str(gpus)
    for key, value in (extra or {}).items():
        limits[key] = value
    return result


def gpu_node(name: str, gpus: int = 8, model: str = H100, memory: int = 81559) -> dict[str, Any]:
    inventory = {
        "version": 1,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{name}-{i}",
                "model": model,
                "memoryMiB": memory,
                "numa": i // 4,
                "healthy": True,
            }
            for i in range(gpus)
        ],
        "nvlink": [[0 if i == j else 18 for j in range(gpus)] for i in range(gpus)],
        "pcie": [["X" if i == j else "NODE" for j in range(gpus)] for i in range(gpus)],
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": model, "nvidia.com/gpu.count": str(gpus)},
            "annotations": {"gpu-admission.io/inventory": json.dumps(inventory)},
        },
        "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": str(gpus)}},
    }


def cluster_objects(quota_gpus: int | None = None) -> list[dict[str, Any]]:
    """Two 8-GPU H100 nodes; the fixture namespaces opted in; team-a with a GPU quota when given."""
    objects: list[dict[str, Any]] = [gpu_node("gpu-a"), gpu_node("gpu-b")]
    for ns in MANAGED_NAMESPACES:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"gpu-admission.io/enabled": "true"}},
            }
        )
    if quota_gpus is not None:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpus", "namespace": "team-a"},
                "spec": {"hard": {"requests.nvidia.com/gpu": str(quota_gpus)}},
            }
        )
    return objects


def review_answer(client: FlaskClient, endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
    """`request` POSTed to `endpoint` as an AdmissionReview; the response, which must come with 200."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    response = client.post(endpoint, data=json.dumps(review), content_type="application/json")
    assert response.status_code == 200
    answer: dict[str, Any] = response.get_json()["response"]
    return answer


def live_app() -> tuple[FlaskClient, StaticSource]:
    """A fresh server with the real core over `cluster_objects()` (the fixtures' namespaces opted in),
    and its source, to read the reservations it made."""
    source = StaticSource(build_snapshot(cluster_objects()))
    return create_app(ServerConfig(source=source, namespace="gpu-admission")).test_client(), source


def gpu_pod_review(
    namespace: str = "team-a",
    gpus: int = 1,
    uid: str = "r-1",
    pod_uid: str | None = None,
    name: str = "train",
    dry_run: bool | None = None,
) -> dict[str, Any]:
    """A minimal pod CREATE review asking for `gpus` GPUs."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if pod_uid is not None:
        metadata["uid"] = pod_uid
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "containers": [
                    {"name": "main", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
                ]
            },
        },
    }
    if dry_run is not None:
        request["dryRun"] = dry_run
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def fake_core(
    mutate: Callable[..., Decision] | None = None,
    validate: Callable[..., Decision] | None = None,
    inventory: Callable[[Mapping[str, Any]], Decision] | None = None,
) -> AdmissionCore:
    """A core whose answers the test chooses; a pod is a GPU pod when it mentions nvidia.com/gpu."""

    def allow(*_args: Any, **_kwargs: Any) -> Decision:
        return Decision(allowed=True)

    return AdmissionCore(
        mutate=mutate or allow,
        validate=validate or allow,
        needs_decision=lambda pod: "nvidia.com/gpu" in json.dumps(pod),
        check_inventory_write=inventory or allow,
    )


def client_certificate(tmp_path: Path, ca_dir: Path) -> tuple[Path, Path]:
    """A client certificate (clientAuth) signed by the CA in `ca_dir`, as the API server would present."""
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # type: ignore[arg-type]
    cert_path, key_path = tmp_path / "client.crt", tmp_path / "client.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def samples(metrics: AdmissionMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


PATCH = ({"op": "add", "path": "/metadata/labels", "value": {"gpu-admission.io/managed": "true"}},)


class Calls:
    """Records what the core was asked; raises when the fast path should have answered."""

    def __init__(self, decision: Decision | None = None, forbid: bool = False) -> None:
        self.decision = decision or Decision(allowed=True, patch=PATCH)
        self.forbid = forbid
        self.seen: list[tuple[str, Any, Any, str | None]] = []

    def mutate(
        self, pod: Mapping[str, Any], snapshot: Snapshot, policy: Any, *, namespace: str | None = None
    ) -> Decision:
        if self.forbid:
            raise AssertionError("the core was called on the fast path")
        self.seen.append(("mutate", pod, policy, namespace))
        return self.decision

    def validate(
        self, pod: Mapping[str, Any], snapshot: Snapshot, policy: Any, *, namespace: str | None = None
    ) -> Decision:
        if self.forbid:
            raise AssertionError("the core was called on the fast path")
        self.seen.append(("validate", pod, policy, namespace))
        return self.decision


def make_app(core: AdmissionCore, source: StaticSource | None = None) -> Flask:
    config = ServerConfig(
        source=source or StaticSource(Snapshot()),
        namespace="gpu-admission",
        core=core,
        policy=PolicyHolder(None, loader=lambda _path: "the-policy"),
    )
    return create_app(config)
