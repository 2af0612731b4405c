"""A real `gpu-admission serve` process over TLS for end-to-end tests and benchmarks, and a keep-alive client."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def cli() -> list[str]:
    """The installed console script when there is one, else the same entry point through Python."""
    found = shutil.which("gpu-admission")
    return [found] if found else [sys.executable, "-m", "webhook.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_certificates(directory: Path, service: str = "gpu-admission", namespace: str = "gpu-admission") -> str:
    """Runs `gpu-admission certs`; returns the caBundle it printed."""
    done = subprocess.run(
        [*cli(), "certs", "--service", service, "--namespace", namespace, "--out", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    port: int
    ca_file: Path
    log_file: Path
    client_cert: tuple[Path, Path] | None = None
    """Presented only by the readiness probe (servers started with --client-ca)."""

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def connection(self, timeout: float = 10.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("localhost", self.port, context=self.context(), timeout=timeout)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 10.0) -> list[str]:
        """The log lines containing `text`, once there are any (a background thread writes the log)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.log().splitlines() if text in line]
            if lines or time.monotonic() > deadline:
                return lines
            time.sleep(0.05)


def post_json(conn: http.client.HTTPConnection, path: str, body: Any) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    return response.status, json.loads(data) if data else None


@contextmanager
def running_server(
    workdir: Path,
    cert_dir: Path,
    extra: Sequence[str] = (),
    boot_timeout: float = 30.0,
    ready_client_cert: tuple[Path, Path] | None = None,
) -> Iterator[RunningServer]:
    """`gpu-admission serve` on a free port; stopped (SIGTERM, then SIGKILL) on exit."""
    port = free_port()
    log_file = workdir / f"serve-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("POD_NAMESPACE", None)
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [*cli(), "serve", "--cert-dir", str(cert_dir), "--bind", f"127.0.0.1:{port}", *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
    server = RunningServer(process, port, cert_dir / "ca.crt", log_file, ready_client_cert)
    try:
        _wait_ready(server, boot_timeout)
        yield server
    finally:
        _stop(process)


def _wait_ready(server: RunningServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"serve exited with {server.process.returncode}:\n{server.log()}")
        context = server.context()
        if server.client_cert is not None:
            context.load_cert_chain(*map(str, server.client_cert))
        conn = http.client.HTTPSConnection("localhost", server.port, context=context, timeout=2)
        try:
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except (OSError, ssl.SSLError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    raise RuntimeError(f"serve did not become ready in {timeout} s:\n{server.log()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
