"""The container image, built from the Dockerfile and run for real: offline build from a wheelhouse,
non-root user, read-only root filesystem, `check` on the examples, and `serve` answering an
AdmissionReview over TLS that the host verifies against the CA, as the API server would.

Slow (about a minute: one image build per session). Needs podman (or a running Docker);
.ci/setup-container.sh installs podman and makes the base image from Debian packages.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("GPU_ADMISSION_BASE_IMAGE", "localhost/debian-python:bookworm")
IMAGE = "localhost/gpu-admission:test"
UID = "65532"
SERVICE, NAMESPACE = "gpu-admission", "gpu-admission"
# What pip cannot install: the only reason these tests may skip.
NEEDS = (
    "needs podman + runc + debootstrap (or a running Docker daemon + debootstrap) to build the base image and run "
    "the container: apt-get install -y podman runc debootstrap, see .ci/setup-container.sh"
)


def cache_dir() -> Path:
    root = os.environ.get("GPU_ADMISSION_CACHE")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-admission"


@dataclass(frozen=True)
class Engine:
    """A container engine command line with this machine's adjustments (podman in a sandbox)."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.argv, *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{self.name} {' '.join(args[:3])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc


def find_engine() -> Engine | None:
    env = dict(os.environ)
    podman = shutil.which("podman")
    if podman:
        conf = cache_dir() / "containers.conf"
        if not conf.exists():  # this sandbox forbids raising rlimits
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text("[containers]\ndefault_ulimits = []\n")
        env["CONTAINERS_CONF"] = str(conf)
        argv = [podman, "--cgroup-manager=cgroupfs"] + (["--runtime=runc"] if shutil.which("runc") else [])
        return Engine("podman", tuple(argv), env)
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0:
        return Engine("docker", (docker,), env)
    return None


def wheelhouse(target: Path) -> None:
    """The project's wheel plus its dependencies; the dependencies are cached per pyproject.toml."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    deps = cache_dir() / "wheelhouse" / digest
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"]
    if not deps.is_dir():
        partial = deps.with_name(digest + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([*pip, f"{ROOT}[agent]", "-w", str(partial)], check=True, timeout=600)
        for own in partial.glob("gpu_admission-*.whl"):
            own.unlink()
        partial.rename(deps)
    target.mkdir(parents=True)
    subprocess.run([*pip, "--no-deps", str(ROOT), "-w", str(target)], check=True, timeout=300)
    for wheel in deps.iterdir():
        shutil.copy2(wheel, target / wheel.name)


@pytest.fixture(scope="module")
def engine() -> Engine:
    found = find_engine()
    if found is None:
        pytest.skip(f"no container engine on this machine: {NEEDS}")
    return found


def dangling_images(engine: Engine) -> set[str]:
    return set(engine("images", "--quiet", "--no-trunc", "--filter", "dangling=true").stdout.split())


@pytest.fixture(scope="module")
def image(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Built once per session; removed afterwards with the build stage it left behind."""
    if engine("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        if shutil.which("debootstrap") is None:
            pytest.skip(f"base image {BASE_IMAGE} is missing and debootstrap is not installed: {NEEDS}")
        env = {**engine.env, "GPU_ADMISSION_ENGINE": engine.name}
        subprocess.run(["bash", str(ROOT / ".ci" / "setup-container.sh")], check=True, env=env, timeout=900)
    context = tmp_path_factory.mktemp("image-context")
    shutil.copy2(ROOT / "Dockerfile", context / "Dockerfile")
    shutil.copy2(ROOT / ".dockerignore", context / ".dockerignore")
    wheelhouse(context / "wheelhouse")
    (context / "stray.txt").write_text("outside the wheelhouse: .dockerignore keeps it out of the build\n")
    before = dangling_images(engine)
    try:
        # Offline: the wheelhouse, named by the build argument (without it the build installs from PyPI).
        engine(
            "build",
            "--network=none",
            f"--build-arg=BASE={BASE_IMAGE}",
            "--build-arg=WHEELHOUSE=wheelhouse",
            "-t",
            IMAGE,
            str(context),
            timeout=900,
        )
        yield IMAGE
    finally:
        engine("rmi", "--force", IMAGE, check=False)
        leftovers = dangling_images(engine) - before
        if leftovers:
            engine("rmi", "--force", *sorted(leftovers), check=False)


def run_in(engine: Engine, *args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """One command in a throwaway container: non-root, read-only root filesystem, no network. `args` are
    engine options, then the image, then the command's arguments."""
    opts = ["run", "--rm", "--read-only", "--network=none", f"--user={UID}:{UID}"]
    if entrypoint:
        opts.append(f"--entrypoint={entrypoint}")
    return engine(*opts, *args, check=False)


def test_image_runs_as_the_fixed_non_root_user(engine: Engine, image: str) -> None:
    inspected = json.loads(engine("image", "inspect", image).stdout)[0]
    config = inspected.get("Config") or inspected["config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["gpu-admission"] and config["Cmd"] == ["serve"]
    ids = engine("run", "--rm", "--read-only", "--network=none", "--entrypoint=id", image, check=True)
    assert ids.stdout.split()[0] == f"uid={UID}(gpu-admission)"


def test_root_filesystem_stays_untouched(engine: Engine, image: str) -> None:
    probe = "import pathlib,sys; pathlib.Path(sys.argv[1]).write_text('x')"
    denied = run_in(engine, image, "-c", probe, "/opt/gpu-admission/probe", entrypoint="python3")
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr
    allowed = run_in(engine, image, "-c", probe, "/tmp/probe", entrypoint="python3")
    assert allowed.returncode == 0, allowed.stderr
    listing = run_in(engine, image, "-c", "import os; print(sorted(os.listdir('/')))", entrypoint="python3")
    assert "wheelhouse" not in listing.stdout and "stray.txt" not in listing.stdout


def test_check_in_the_container_matches_the_host(engine: Engine, image: str) -> None:
    examples = ROOT / "examples"
    inside = run_in(engine, "-v", f"{examples}:/examples:ro", image, "check", "/examples", "-o", "json")
    host = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "check", str(examples), "-o", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert (inside.returncode, inside.stderr) == (host.returncode, host.stderr)

    def report(out: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(out)
        for result in data["results"]:
            result["source"] = Path(result["source"]).name  # /examples/... inside, the checkout outside
        return data

    inside_report = report(inside.stdout)
    assert inside_report == report(host.stdout)
    verdicts = {r["allowed"] for r in inside_report["results"] if not r["skipped"]}
    assert verdicts == {True, False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 that verifies the certificate for the Service's DNS name, as the API server does."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=10)
        self.server_name = f"{SERVICE}.{NAMESPACE}.svc"

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.server_name)  # type: ignore[attr-defined]


def request(port: int, context: ssl.SSLContext, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = ServiceConnection(port, context)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_ready(port: int, context: ssl.SSLContext, alive: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise AssertionError("the server exited before it was ready")
        try:
            if request(port, context, "GET", "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"no ready server on port {port} after {timeout} s")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "certs",
            "--service",
            SERVICE,
            "--namespace",
            NAMESPACE,
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    # The container user owns nothing here; in the chart the Secret volume's fsGroup gives it access.
    out.chmod(0o755)
    (out / "tls.key").chmod(0o644)
    return out


@pytest.fixture(scope="module")
def served(engine: Engine, image: str, certificates: Path) -> Iterator[tuple[int, ssl.SSLContext]]:
    port, name = free_port(), f"gpu-admission-test-{os.getpid()}"
    engine(
        "run",
        "-d",
        "--name",
        name,
        "--read-only",
        "--network=host",
        f"--user={UID}:{UID}",
        "-v",
        f"{certificates}:/etc/gpu-admission/tls:ro",
        image,
        "serve",
        "--cert-dir=/etc/gpu-admission/tls",
        f"--bind=127.0.0.1:{port}",
    )
    context = ssl.create_default_context(cafile=str(certificates / "ca.crt"))

    def alive() -> bool:
        state = engine("inspect", "--format", "{{.State.Running}}", name, check=False)
        return state.stdout.strip() == "true"

    try:
        wait_ready(port, context, alive)
        yield port, context
    finally:
        engine("stop", "--time=20", name, check=False)  # SIGTERM: gunicorn drains and exits
        logs = engine("logs", name, check=False)
        engine("rm", "--force", name, check=False)
        sys.stderr.write(logs.stderr[-2000:])


def review(uid: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
            "dryRun": True,
        },
    }


def gpu_pod(name: str, limits: dict[str, str], env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda", "resources": {"limits": limits}}
    if env:
        container["env"] = env
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"containers": [container]},
    }


def test_serve_in_the_container_answers_a_gpu_pod_over_tls(served: tuple[int, ssl.SSLContext]) -> None:
    port, context = served
    status, body = request(
        port,
        context,
        "POST",
        "/mutate",
        review("uid-1", gpu_pod("train", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"})),
    )
    assert status == 200
    answer = json.loads(body)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "uid-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    memory = [op for op in patch if op["path"] == "/spec/containers/0/env"]
    assert memory and {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "10000m"} in memory[0]["value"]
    annotations = [op["value"] for op in patch if op["path"] == "/metadata/annotations"]
    allocation = json.loads(annotations[0]["gpu-admission.io/allocation"])
    assert allocation["gpuCount"] == 1 and allocation["memoryMiB"] == 10000 and allocation["node"]


def test_serve_in_the_container_refuses_an_isolation_bypass(served: tuple[int, ssl.SSLContext]) -> None:
    port, context = served
    sneaky = gpu_pod("sneaky", {"cpu": "1"}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    status, body = request(port, context, "POST", "/validate", review("uid-2", sneaky))
    assert status == 200
    response = json.loads(body)["response"]
    assert response["uid"] == "uid-2" and response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "NVIDIA_VISIBLE_DEVICES" in response["status"]["message"]


def test_serve_refuses_clients_that_do_not_trust_its_ca(served: tuple[int, ssl.SSLContext]) -> None:
    port, _ = served
    with pytest.raises(ssl.SSLCertVerificationError):
        request(port, ssl.create_default_context(), "GET", "/healthz")


def served_certificate(port: int, context: ssl.SSLContext) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    with context.wrap_socket(sock, server_hostname=f"{SERVICE}.{NAMESPACE}.svc") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_renewed_certificate_is_served_without_a_restart(
    served: tuple[int, ssl.SSLContext], certificates: Path
) -> None:
    port, context = served
    before = served_certificate(port, context)
    subprocess.run(
        [sys.executable, "-m", "webhook.cli", "certs", "--service", SERVICE, "--namespace", NAMESPACE]
        + ["--out", str(certificates), "--renew"],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    (certificates / "tls.key").chmod(0o644)
    on_disk = ssl.PEM_cert_to_DER_cert((certificates / "tls.crt").read_text())
    assert on_disk != before
    deadline = time.monotonic() + 20
    while served_certificate(port, context) != on_disk:  # same CA: the old context still verifies it
        assert time.monotonic() < deadline, "the server still presents the old certificate after 20 s"
        time.sleep(0.5)
    status, _ = request(port, context, "GET", "/healthz")
    assert status == 200


def test_the_default_build_context_holds_a_source_pip_can_build(tmp_path: Path) -> None:
    """Without WHEELHOUSE the image installs the source that .dockerignore lets into the context: that
    source alone must build (no container engine needed to check it)."""
    admitted = [
        line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    context = tmp_path / "context"
    context.mkdir()
    for name in admitted:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, context / name)
    assert {"pyproject.toml", "README.md", "webhook"} <= {p.name for p in context.iterdir()}
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(tmp_path / "out"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    assert [w.name for w in (tmp_path / "out").iterdir()] == ["gpu_admission-0.1.0-py3-none-any.whl"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install '/src[agent]'" in dockerfile and 'ARG WHEELHOUSE=""' in dockerfile
