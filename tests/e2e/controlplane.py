"""A real Kubernetes control plane on 127.0.0.1 for the end-to-end tests, as envtest runs one.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager are built from their Go modules by
`controlplane/build.sh` (cached under ~/.cache/gpu-admission/controlplane/) and run here as local
processes with generated certificates: the API server with Node,RBAC authorization and its default
admission plugins (ResourceQuota among them). No kubelet runs, so pods are bound but never start.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from webhook.certs.authority import make_ca

BUILD_SCRIPT = Path(__file__).resolve().parent / "controlplane" / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
SERVICE_CIDR = "10.96.0.0/16"


class ControlPlaneError(RuntimeError):
    """A binary could not be built or a process did not come up; the message carries its log's tail."""


def build() -> Path:
    """The folder holding the four binaries, built first where missing (minutes when cold)."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3000)
    if done.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    folder = Path(done.stdout.strip().splitlines()[-1])
    missing = [name for name in BINARIES if not (folder / name).is_file()]
    if missing:
        raise ControlPlaneError(f"{BUILD_SCRIPT} left no {', '.join(missing)} in {folder}")
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Authority:
    """A CA that signs the API server's serving certificate and the clients' certificates."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls, name: str) -> Authority:
        key, cert = make_ca(name, days=2)  # the project's own cert tool
        return cls(key, cert)

    def issue(
        self, common_name: str, groups: tuple[str, ...] = (), dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()
    ) -> tuple[bytes, bytes]:
        """PEM certificate and key; with SANs a serving certificate, else a client one (CN user, O groups)."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        serving = bool(dns or ips)
        usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if serving else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if serving:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def kubeconfig(server: str, ca_file: Path, user: dict[str, str], name: str = "e2e") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


@dataclass
class ControlPlane:
    """The four processes, their files under `workdir`, and an admin kubeconfig (system:masters)."""

    bin_dir: Path
    workdir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    api_port: int = 0
    admin_kubeconfig: Path = Path()
    ca_file: Path = Path()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def start(self, scheduler: bool = True, controller_manager: bool = True) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ca = Authority.make("e2e-kubernetes-ca")
        self.ca_file = self._write(pki / "ca.crt", ca.pem())
        cert, key = ca.issue(
            "kube-apiserver",
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ips=("127.0.0.1", "10.96.0.1"),
        )
        serving = (self._write(pki / "apiserver.crt", cert), self._write(pki / "apiserver.key", key))
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        sa_private = self._write(
            pki / "sa.key",
            sa_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )
        sa_public = self._write(
            pki / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )
        self.api_port = free_port()
        self.admin_kubeconfig = self._client_kubeconfig(ca, "admin", ("system:masters",))
        admission_config = self._webhook_client_config(ca)
        etcd_client, etcd_peer = free_port(), free_port()
        self._spawn(
            "etcd",
            [
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={serving[0]}",
                f"--tls-private-key-file={serving[1]}",
                f"--client-ca-file={self.ca_file}",
                f"--service-account-key-file={sa_public}",
                f"--service-account-signing-key-file={sa_private}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                "--enable-priority-and-fairness=true",
                f"--admission-control-config-file={admission_config}",
                "--v=1",
            ],
        )
        self.wait_ready()
        if scheduler:
            config = self._client_kubeconfig(ca, "system:kube-scheduler")
            self._spawn(
                "kube-scheduler", [f"--kubeconfig={config}", "--leader-elect=false", "--secure-port=0", "--v=1"]
            )
        if controller_manager:
            config = self._client_kubeconfig(ca, "system:kube-controller-manager")
            self._spawn(
                "kube-controller-manager",
                [
                    f"--kubeconfig={config}",
                    "--leader-elect=false",
                    "--secure-port=0",
                    # no kubelet: nothing may mark the fake nodes unreachable and evict their pods
                    "--controllers=*,-node-lifecycle-controller,-taint-eviction-controller,-node-ipam-controller",
                    f"--service-account-private-key-file={sa_private}",
                    f"--root-ca-file={self.ca_file}",
                    "--use-service-account-credentials=true",
                    "--v=1",
                ],
            )

    def _client_kubeconfig(self, ca: Authority, user: str, groups: tuple[str, ...] = ()) -> Path:
        cert, key = ca.issue(user, groups=groups)
        stem = user.replace(":", "-")
        pki = self.workdir / "pki"
        cert_file, key_file = self._write(pki / f"{stem}.crt", cert), self._write(pki / f"{stem}.key", key)
        config = kubeconfig(
            self.server, self.ca_file, {"client-certificate": str(cert_file), "client-key": str(key_file)}
        )
        return self._write(self.workdir / f"{stem}.kubeconfig", yaml.safe_dump(config).encode())

    def _webhook_client_config(self, ca: Authority) -> Path:
        """The API server presents a client certificate of this CA to every webhook (AdmissionConfiguration
        with a kubeConfigFile whose user "*" matches any webhook host), so a webhook can tell it apart."""
        cert, key = ca.issue("kube-apiserver-webhook-client")
        pki = self.workdir / "pki"
        cert_file = self._write(pki / "webhook-client.crt", cert)
        key_file = self._write(pki / "webhook-client.key", key)
        users = {
            "apiVersion": "v1",
            "kind": "Config",
            "users": [{"name": "*", "user": {"client-certificate": str(cert_file), "client-key": str(key_file)}}],
        }
        config_file = self._write(self.workdir / "webhook-client.kubeconfig", yaml.safe_dump(users).encode())
        webhook = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(config_file),
        }
        admission = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [
                {"name": name, "configuration": webhook}
                for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
            ],
        }
        return self._write(self.workdir / "admission.yaml", yaml.safe_dump(admission).encode())

    def token_kubeconfig(self, token: str, name: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
        config = kubeconfig(self.server, self.ca_file, {"token": token})
        return self._write(self.workdir / f"{name}.kubeconfig", yaml.safe_dump(config).encode())

    @staticmethod
    def _write(path: Path, data: bytes) -> Path:
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def log_file(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _spawn(self, name: str, args: list[str]) -> None:
        self.processes[name] = spawn([str(self.bin_dir / name), *args], self.log_file(name))

    def wait_ready(self, timeout: float = 60.0) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        config = yaml.safe_load(self.admin_kubeconfig.read_text())["users"][0]["user"]
        context.load_cert_chain(config["client-certificate"], config["client-key"])
        deadline = time.monotonic() + timeout
        while True:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise ControlPlaneError(f"{name} exited {process.returncode}:\n{self.tail(name)}")
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"kube-apiserver not ready in {timeout:.0f} s:\n{self.tail('kube-apiserver')}")
            time.sleep(0.2)

    def tail(self, name: str, size: int = 3000) -> str:
        try:
            return self.log_file(name).read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stops every process (the API server before etcd) and waits for each."""
        for name in reversed(list(self.processes)):
            process = self.processes.pop(name)
            stop_process(process)


_STARTED: list[subprocess.Popen[bytes]] = []


def spawn(command: list[str], log_file: Path, **options: object) -> subprocess.Popen[bytes]:
    """A process in a session of its own, its output in `log_file`; stopped at exit at the latest."""
    with open(log_file, "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **options,  # type: ignore[call-overload]
        )
    _STARTED.append(process)
    return process


@atexit.register
def _stop_leftovers() -> None:
    for process in reversed(_STARTED):
        stop_process(process, grace=5.0)


def stop_process(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(grace)


def start_control_plane(scheduler: bool = True, controller_manager: bool = True) -> ControlPlane:
    plane = ControlPlane(build(), Path(tempfile.mkdtemp(prefix="gpu-admission-e2e-")))
    try:
        plane.start(scheduler=scheduler, controller_manager=controller_manager)
    except BaseException:
        plane.stop()
        raise
    return plane
