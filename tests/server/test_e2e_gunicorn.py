"""End to end: `gpu-admission certs`, then `gpu-admission serve` (gunicorn, TLS) answering real reviews.

The fixtures are public AdmissionReview captures with a GPU request added; each returned patch is
decoded, applied with jsonpatch, and the patched Pod validated against the Kubernetes OpenAPI schema.
"""

from __future__ import annotations

import copy
import http.client
import json
import re
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from e2e_server import RunningServer, cli, make_certificates, post_json, running_server
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_validate.utils import latest_version
from server_support import FIXTURE_FILES, client_certificate, cluster_objects, fixture_review, gpu_pod_review, with_gpu

from webhook.server.review import decode_patch

pytestmark = pytest.mark.slow
SCHEMA_VERSIONS = ("1.30.0", latest_version())
QUOTA = 12  # team-a's GPU quota; the cluster has 16 GPUs


def write_cluster(path: Path, objects: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def cert_dir(workdir: Path) -> Path:
    directory = workdir / "certs"
    make_certificates(directory)
    return directory


@pytest.fixture(scope="module")
def server(workdir: Path, cert_dir: Path) -> Iterator[RunningServer]:
    cluster = write_cluster(workdir / "cluster.json", cluster_objects(quota_gpus=QUOTA))
    with running_server(workdir, cert_dir, ["--cluster", str(cluster), "--threads", "8"]) as running:
        yield running


def gpu_fixtures(gpus: int = 2) -> list[dict[str, Any]]:
    return [with_gpu(fixture_review(name), gpus) for name in FIXTURE_FILES]


def mutated_pod(review: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    return jsonpatch.apply_patch(review["request"]["object"], decode_patch(answer["response"]))


def as_validating(review: dict[str, Any], pod: dict[str, Any], pod_uid: str) -> dict[str, Any]:
    """The review the validating webhook gets: the final pod, now with its UID."""
    result = copy.deepcopy(review)
    pod = copy.deepcopy(pod)
    pod.setdefault("metadata", {})["uid"] = pod_uid
    result["request"]["object"] = pod
    return result


def test_fixtures_are_mutated_into_valid_pods_and_then_admitted(server: RunningServer) -> None:
    conn = server.connection()
    for index, review in enumerate(gpu_fixtures()):
        uid = review["request"]["uid"]
        status, answer = post_json(conn, "/mutate", review)
        assert status == 200
        assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
        response = answer["response"]
        assert response["uid"] == uid and response["allowed"] is True, response
        assert response["patchType"] == "JSONPatch"
        pod = mutated_pod(review, answer)
        assert pod["metadata"]["labels"]["gpu-admission.io/managed"] == "true"
        recorded = json.loads(pod["metadata"]["annotations"]["gpu-admission.io/allocation"])
        assert recorded["gpuCount"] == 2 and recorded["vendor"] == "nvidia"
        for version in SCHEMA_VERSIONS:
            kubernetes_validate.validate(pod, version, strict=True)
        # A second pass over the mutated pod changes nothing.
        again = as_validating(review, pod, f"pod-{index}")
        status, answer = post_json(conn, "/mutate", again)
        assert (status, answer["response"]) == (200, {"uid": uid, "allowed": True})
        status, answer = post_json(conn, "/validate", again)
        assert (status, answer["response"]) == (200, {"uid": uid, "allowed": True})
    conn.close()


def test_bad_requests_over_tls(server: RunningServer) -> None:
    conn = server.connection()
    assert post_json(conn, "/validate", b"")[0] == 400
    assert post_json(conn, "/validate", b"{]")[0] == 400
    conn.request("POST", "/mutate", body=b"{}", headers={"Content-Type": "text/plain"})
    response = conn.getresponse()
    assert (response.status, json.loads(response.read())["code"]) == (415, 415)
    conn.request("POST", "/mutate", body=b"x" * (3 * 1024 * 1024 + 1), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert (response.status, json.loads(response.read())["code"]) == (413, 413)
    conn.close()


@settings(max_examples=40, deadline=timedelta(seconds=5), database=None)
@given(
    endpoint=st.sampled_from(["/mutate", "/validate"]),
    body=st.binary(max_size=512)
    | st.sampled_from([json.dumps(r).encode()[:n] for r in gpu_fixtures() for n in (50, 900)]),
)
def test_fuzzed_bodies_over_tls_get_4xx_or_a_review(server: RunningServer, endpoint: str, body: bytes) -> None:
    conn = server.connection()
    try:
        status, answer = post_json(conn, endpoint, body)
    finally:
        conn.close()
    assert status in (200, 400), (status, answer)
    assert answer["kind"] == ("AdmissionReview" if status == 200 else "Status")


def test_plaintext_is_refused_on_the_admission_port(server: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as plain:
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            reply = plain.recv(1024)
        except ConnectionResetError:
            reply = b""
    assert not reply.startswith(b"HTTP/")


@pytest.mark.parametrize(("maximum", "negotiated"), [(None, "TLSv1.3"), (ssl.TLSVersion.TLSv1_2, "TLSv1.2")])
def test_tls_versions_served(server: RunningServer, maximum: ssl.TLSVersion | None, negotiated: str) -> None:
    context = server.context()
    if maximum is not None:
        context.maximum_version = maximum
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        assert tls.version() == negotiated


def test_200_concurrent_admissions_take_exactly_the_quota(server: RunningServer) -> None:
    """200 clients at once: each gets its own answer; exactly the quota's worth of pods is admitted."""
    reviews = [gpu_pod_review(namespace="team-a", uid=f"c-{i}", name=f"job-{i}") for i in range(200)]
    verdicts: dict[int, dict[str, Any]] = {}
    failures: list[str] = []
    barrier = threading.Barrier(200)

    def client(i: int) -> None:
        conn = server.connection(timeout=60)
        try:
            barrier.wait(timeout=60)
            status, answer = post_json(conn, "/mutate", reviews[i])
            assert status == 200 and answer["response"]["uid"] == f"c-{i}", answer
            if not answer["response"]["allowed"]:  # the quota is already taken when the patch is planned
                verdicts[i] = answer["response"]
                return
            final = as_validating(reviews[i], mutated_pod(reviews[i], answer), f"pod-{i}")
            status, answer = post_json(conn, "/validate", final)
            assert status == 200 and answer["response"]["uid"] == f"c-{i}", answer
            verdicts[i] = answer["response"]
        except Exception as err:  # collected: an assertion in a thread would be lost
            failures.append(f"{i}: {err!r}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failures == []
    allowed = [i for i, v in verdicts.items() if v["allowed"]]
    denied = [v for v in verdicts.values() if not v["allowed"]]
    assert len(verdicts) == 200 and len(allowed) == QUOTA
    assert {(v["status"]["code"], v["status"]["reason"]) for v in denied} == {(403, "quota-exceeded")}
    conn = server.connection()
    conn.request("GET", "/metrics")
    metrics = conn.getresponse().read().decode()
    assert f'gpu_admission_quota_used{{namespace="team-a",resource="requests.nvidia.com/gpu"}} {QUOTA}.0' in metrics
    denied_counts = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("gpu_admission_decisions_total{") and 'reason="quota-exceeded"' in line
    ]
    assert sum(denied_counts) == 200 - QUOTA
    conn.close()


def test_dry_run_answers_alike_and_reserves_nothing(server: RunningServer) -> None:
    conn = server.connection()
    review = gpu_pod_review(namespace="foo", uid="dry-1", name="dry")
    _, answer = post_json(conn, "/mutate", review)
    pod = as_validating(review, mutated_pod(review, answer), "dry-pod")
    pod["request"]["dryRun"] = True
    for _ in range(3):
        status, answer = post_json(conn, "/validate", pod)
        assert (status, answer["response"]) == (200, {"uid": "dry-1", "allowed": True})
    conn.request("GET", "/metrics")
    assert 'namespace="foo"' not in conn.getresponse().read().decode()  # nothing counted against foo
    conn.close()


def test_idle_and_stalled_connections_do_not_stall_admissions(server: RunningServer) -> None:
    """More silent connections than threads, and one stuck mid-handshake: a real request is still answered."""
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(12)]
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    stalled.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello, then nothing
    try:
        started = time.monotonic()
        conn = server.connection(timeout=15)
        status, answer = post_json(conn, "/validate", gpu_pod_review(namespace="kube-system", uid="busy"))
        conn.close()
        assert (status, answer["response"]["allowed"]) == (200, True)
        assert time.monotonic() - started < 4.0  # under the API server's 5 s timeout
    finally:
        for s in [*silent, stalled]:
            s.close()


def tls_client(server: RunningServer) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return server.context().wrap_socket(raw, server_hostname="localhost")


def raw_review(uid: str, connection: str = "keep-alive") -> tuple[bytes, bytes]:
    """The head and the body of a /validate request, as bytes to send by hand."""
    body = json.dumps(gpu_pod_review(namespace="kube-system", uid=uid)).encode()
    head = (
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Connection: {connection}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode(), body


def read_answer(sock: ssl.SSLSocket) -> tuple[int, Any]:
    response = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    response.begin()
    return response.status, json.loads(response.read())


def closed_by_server(sock: ssl.SSLSocket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionError, ssl.SSLError):  # a reset, or a TLS session ended mid-record
        return True


def log_since(server: RunningServer, offset: int) -> str:
    return server.log()[offset:]


def test_clients_that_go_silent_mid_request_are_cut_off(server: RunningServer) -> None:
    """More kept-alive clients than threads send half of their second request and go silent: each is
    cut off after the client timeout (logged as a 408), and admissions go on meanwhile."""
    offset = len(server.log())
    started = time.monotonic()
    silent = []
    for i in range(10):
        client = tls_client(server)
        head, body = raw_review(f"first-{i}")
        client.sendall(head + body)
        assert read_answer(client)[0] == 200
        head, body = raw_review(f"second-{i}")
        client.sendall(head + body[: len(body) // 2])
        silent.append(client)
    conn = server.connection(timeout=10)
    status, answer = post_json(conn, "/validate", gpu_pod_review(namespace="kube-system", uid="meanwhile"))
    conn.close()
    assert (status, answer["response"]["allowed"]) == (200, True)
    assert time.monotonic() - started < 6.0  # the first eight held every thread until they were cut off
    for client in silent:
        assert closed_by_server(client)
        client.close()
    deadline = time.monotonic() + 10
    while log_since(server, offset).count('"code":408') < 10 and time.monotonic() < deadline:
        time.sleep(0.05)  # the log is written by a background thread
    cut_off = "request body not received in full: no progress from the client in 3 s"
    assert log_since(server, offset).count(cut_off) == 10
    assert "Traceback" not in log_since(server, offset)
    conn = server.connection()
    conn.request("GET", "/metrics")
    counted = re.search(r"^gpu_admission_connections_cut_off_total (\S+)$", conn.getresponse().read().decode(), re.M)
    conn.close()
    assert counted is not None and float(counted.group(1)) >= 10


def test_a_client_stalling_in_the_headers_is_dropped_quietly(server: RunningServer) -> None:
    offset = len(server.log())
    client = tls_client(server)
    head, body = raw_review("before-stall")
    client.sendall(head + body)
    assert read_answer(client)[0] == 200
    client.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\n")  # and nothing more
    started = time.monotonic()
    assert closed_by_server(client)
    assert 2.0 < time.monotonic() - started < 6.0
    client.close()
    quiet = server.wait_for_log("client went silent mid-request; connection closed")
    assert quiet and all('"level":"info"' in line for line in quiet)
    assert "Traceback" not in log_since(server, offset)


def test_clients_that_never_close_do_not_freeze_the_server(server: RunningServer) -> None:
    """A client asks the server to close, then keeps its own end open: the server must not sit
    waiting for that client's FIN while other requests queue."""
    lingering = []
    for i in range(6):
        client = tls_client(server)
        head, body = raw_review(f"close-{i}", connection="close")
        client.sendall(head + body)
        lingering.append(client)
    for client in lingering:
        assert read_answer(client)[0] == 200
    started = time.monotonic()
    conn = server.connection(timeout=20)
    status, _ = post_json(conn, "/validate", gpu_pod_review(namespace="kube-system", uid="after-close"))
    conn.close()
    assert status == 200
    assert time.monotonic() - started < 2.0  # waiting for each client's FIN: 2 s apiece
    for client in lingering:
        assert closed_by_server(client)
        client.close()


def peer_certificate(server: RunningServer) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        server.context().wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_certificate_rotation_without_restart(workdir: Path, cert_dir: Path, server: RunningServer) -> None:
    before = peer_certificate(server)
    kept = server.connection()
    assert post_json(kept, "/validate", gpu_pod_review(namespace="kube-system", uid="k1"))[0] == 200
    subprocess.run(
        [
            *cli(),
            "certs",
            "--service",
            "gpu-admission",
            "--namespace",
            "gpu-admission",
            "--out",
            str(cert_dir),
            "--renew",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    after = peer_certificate(server)
    assert after != before
    assert ssl.DER_cert_to_PEM_cert(after).strip() == (cert_dir / "tls.crt").read_text().strip()
    assert post_json(kept, "/validate", gpu_pod_review(namespace="kube-system", uid="k2"))[0] == 200
    kept.close()
    assert server.process.poll() is None
    assert server.wait_for_log('"msg":"serving certificate reloaded from')


def test_client_ca_and_tls_1_3_only(workdir: Path, cert_dir: Path) -> None:
    """--client-ca: a client without a certificate gets 403 on the admission endpoints (the probes stay open
    for the kubelet), one with a certificate from another CA no connection; --tls-min 1.3 refuses 1.2."""
    clients = workdir / "client-ca"
    make_certificates(clients, "unused", "unused")
    cert, key = client_certificate(workdir, clients)
    cluster = write_cluster(workdir / "mtls-cluster.json", cluster_objects())
    extra = ["--cluster", str(cluster), "--client-ca", str(clients / "ca.crt"), "--tls-min", "1.3"]
    with running_server(workdir, cert_dir, extra, ready_client_cert=(cert, key)) as server:
        anonymous = server.connection()
        for endpoint in ("/validate", "/mutate"):
            status, answer = post_json(anonymous, endpoint, gpu_pod_review(uid="anon"))
            assert (status, answer["kind"], answer["code"]) == (403, "Status", 403)
            assert "answer only the API server" in answer["message"]
        anonymous.request("GET", "/healthz")
        assert anonymous.getresponse().read() == b"ok\n"
        anonymous.close()
        stranger = workdir / "stranger-ca"
        make_certificates(stranger, "unused", "unused")
        (workdir / "stranger").mkdir(exist_ok=True)
        other_cert, other_key = client_certificate(workdir / "stranger", stranger)
        foreign = server.context()
        foreign.load_cert_chain(str(other_cert), str(other_key))
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw, pytest.raises(
            (ssl.SSLError, ConnectionError)
        ), foreign.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            if not tls.recv(1):
                raise ConnectionError("closed")
        old = server.context()
        old.load_cert_chain(str(cert), str(key))
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw, pytest.raises(ssl.SSLError):
            old.wrap_socket(raw, server_hostname="localhost").close()
        context = server.context()
        context.load_cert_chain(str(cert), str(key))
        conn = http.client.HTTPSConnection("localhost", server.port, context=context, timeout=10)
        status, answer = post_json(conn, "/validate", gpu_pod_review(namespace="kube-system", uid="mtls"))
        conn.close()
        assert (status, answer["response"]) == (200, {"uid": "mtls", "allowed": True})


def test_logs_are_json_lines_one_per_admission(server: RunningServer) -> None:
    conn = server.connection()
    post_json(conn, "/validate", gpu_pod_review(namespace="kube-system", uid="log-probe-1"))
    conn.close()
    probe = [json.loads(line) for line in server.wait_for_log('"log-probe-1"')]
    assert len(probe) == 1 and probe[0]["reason"] == "excluded-namespace" and probe[0]["verdict"] == "allowed"
    assert all(line.startswith("{") and json.loads(line) for line in server.log().splitlines() if line.strip())


def unsealed(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The patch with the record's seal and nonce left out: each side seals with its own key (check has no
    installation's key), the webhook's nonce is its review's uid (check has no review), and everything
    else the seal covers must still agree."""
    key = "gpu-admission.io/allocation"
    out = []
    for op in ops:
        if op["path"].endswith("gpu-admission.io~1allocation") or op["path"] == "/metadata/annotations":
            whole = op["path"] == "/metadata/annotations"  # the first annotation of the pod: the whole map
            record = json.loads(op["value"][key] if whole else op["value"])
            assert len(record.pop("seal")) == 32
            record.pop("nonce", None)
            op = {**op, "value": {**op["value"], key: record} if whole else record}
        out.append(op)
    return out


def test_webhook_agrees_with_check(workdir: Path, cert_dir: Path) -> None:
    """The same pods, the same cluster: `check` and the webhook give the same verdicts, patches and messages."""
    objects = cluster_objects()
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "q", "namespace": "default"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "3"}},
        }
    )
    cluster = write_cluster(workdir / "agree-cluster.json", objects)
    reviews = gpu_fixtures()
    for review in reviews:
        review["request"]["object"]["metadata"]["namespace"] = review["request"]["namespace"]
    manifest = workdir / "pods.json"
    manifest.write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [r["request"]["object"] for r in reviews]})
    )
    checked = subprocess.run(
        [*cli(), "check", "--cluster", str(cluster), "-o", "json", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode in (0, 1), checked.stderr
    results = json.loads(checked.stdout)["results"]
    assert len(results) == len(reviews)
    verdicts = []
    with running_server(workdir, cert_dir, ["--cluster", str(cluster)]) as server:
        conn = server.connection()
        for index, (review, result) in enumerate(zip(reviews, results, strict=True)):
            _, answer = post_json(conn, "/mutate", review)
            response = answer["response"]
            if not response["allowed"]:
                got = (False, response["status"]["code"], response["status"]["message"])
            else:
                assert unsealed(decode_patch(response)) == unsealed(result["patch"])
                final = as_validating(review, mutated_pod(review, answer), f"check-{index}")
                _, answer = post_json(conn, "/validate", final)
                response = answer["response"]
                status = response.get("status", {"code": 200, "message": result["message"]})
                got = (response["allowed"], status["code"], status["message"])
            assert got == (result["allowed"], result["code"], result["message"]), result["source"]
            verdicts.append(got[0])
        conn.close()
    # default's quota of 3 GPUs holds the first 2-GPU pod there, not the second.
    assert verdicts == [True, True, False, True]
