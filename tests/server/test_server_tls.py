"""Server TLS: minimum versions, client certificates, and certificates reloaded when the files change."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from server_support import client_certificate

from webhook.certs import authority as certs
from webhook.server.tls import ReloadingContext, ServerContext, TlsFiles, build_context, connections_cut_off

HOST = "gpu-admission.gpu-admission.svc"


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str = HOST) -> bytes:
    """A full TLS handshake in memory; returns the DER of the certificate the server presented."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, end in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            peer = client.getpeercert(binary_form=True)
            assert peer is not None
            return peer
    raise AssertionError("handshake did not finish")


def client_context(ca: Path, maximum: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if maximum is not None:
        ctx.maximum_version = maximum
    return ctx


@pytest.fixture()
def pair(tmp_path: Path) -> certs.CertificatePaths:
    return certs.issue_certificates(tmp_path, "gpu-admission", "gpu-admission", days=2)


def der(path: Path) -> bytes:
    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(serialization.Encoding.DER)


def test_serves_the_certificate_on_disk_to_a_verifying_client(pair: certs.CertificatePaths) -> None:
    context = build_context(TlsFiles(str(pair.cert), str(pair.key)))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert handshake(context, client_context(pair.ca_cert)) == der(pair.cert)


def test_tls_1_3_minimum_refuses_a_tls_1_2_client(pair: certs.CertificatePaths) -> None:
    context = build_context(TlsFiles(str(pair.cert), str(pair.key), min_version="1.3"))
    handshake(context, client_context(pair.ca_cert))  # a 1.3-capable client is fine
    with pytest.raises(ssl.SSLError):
        handshake(context, client_context(pair.ca_cert, maximum=ssl.TLSVersion.TLSv1_2))


def test_unknown_minimum_version_is_refused(pair: certs.CertificatePaths) -> None:
    with pytest.raises(ValueError, match="unsupported minimum TLS version '1.1': expected 1.2 or 1.3"):
        build_context(TlsFiles(str(pair.cert), str(pair.key), min_version="1.1"))


def test_client_ca_verifies_any_certificate_sent_and_lets_probes_connect_without_one(tmp_path: Path) -> None:
    """CERT_OPTIONAL: the kubelet's probes connect without a certificate (the admission endpoints then
    refuse such a caller, tests/server/test_e2e_gunicorn.py); a certificate from another CA fails the
    handshake; one from the client CA is accepted."""
    server = certs.issue_certificates(tmp_path / "server", "gpu-admission", "gpu-admission")
    clients = certs.issue_certificates(tmp_path / "clients", "unused", "unused")
    strangers = certs.issue_certificates(tmp_path / "strangers", "unused", "unused")
    context = build_context(TlsFiles(str(server.cert), str(server.key), client_ca=str(clients.ca_cert)))
    assert context.verify_mode == ssl.CERT_OPTIONAL
    anonymous = client_context(server.ca_cert, maximum=ssl.TLSVersion.TLSv1_2)
    assert handshake(context, anonymous) == der(server.cert)
    (tmp_path / "stranger").mkdir()
    cert, key = client_certificate(tmp_path / "stranger", tmp_path / "strangers")
    foreign = client_context(server.ca_cert, maximum=ssl.TLSVersion.TLSv1_2)  # 1.2: failure inside handshake
    foreign.load_cert_chain(str(cert), str(key))
    with pytest.raises(ssl.SSLError):
        handshake(context, foreign)
    assert strangers.ca_cert != clients.ca_cert
    cert, key = client_certificate(tmp_path, tmp_path / "clients")
    authenticated = client_context(server.ca_cert, maximum=ssl.TLSVersion.TLSv1_2)
    authenticated.load_cert_chain(str(cert), str(key))
    assert handshake(context, authenticated) == der(server.cert)


def test_new_certificate_on_disk_is_served_to_new_connections(pair: certs.CertificatePaths) -> None:
    reloading = ReloadingContext(TlsFiles(str(pair.cert), str(pair.key)))
    first = reloading.context()
    assert reloading.context() is first  # unchanged files: the same context, no reload
    old = der(pair.cert)
    certs.issue_certificates(pair.directory, "gpu-admission", "gpu-admission", renew=True)
    served = handshake(reloading.gunicorn_hook(None, lambda: first), client_context(pair.ca_cert))
    assert served == der(pair.cert) != old
    assert reloading.reloads == 1


def test_a_pair_that_does_not_load_keeps_the_previous_one(
    pair: certs.CertificatePaths, caplog: pytest.LogCaptureFixture
) -> None:
    reloading = ReloadingContext(TlsFiles(str(pair.cert), str(pair.key)))
    old = der(pair.cert)
    good_key = pair.key.read_bytes()
    other = certs.issue_certificates(pair.directory / "other", "x", "y")
    with caplog.at_level(logging.WARNING, logger="webhook.server.tls"):
        pair.key.write_bytes(other.key.read_bytes())  # a key that does not match the certificate
        assert handshake(reloading.context(), client_context(pair.ca_cert)) == old
        assert handshake(reloading.context(), client_context(pair.ca_cert)) == old
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith(
        "certificate files changed but do not load, still serving the previous ones:"
    )
    pair.key.write_bytes(good_key + b"\n")  # fixed: loads on the next connection
    assert handshake(reloading.context(), client_context(pair.ca_cert)) == old
    assert reloading.reloads == 1


def test_start_up_fails_loudly_without_a_valid_pair(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ReloadingContext(TlsFiles(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")))


def test_gunicorn_hook_signature(pair: certs.CertificatePaths) -> None:
    reloading = ReloadingContext(TlsFiles(str(pair.cert), str(pair.key)))
    factory_called: list[Any] = []
    context = reloading.gunicorn_hook(object(), lambda: factory_called.append(1))  # type: ignore[arg-type,func-returns-value]
    assert isinstance(context, ssl.SSLContext) and factory_called == []


def test_a_stalled_handshake_times_out(pair: certs.CertificatePaths) -> None:
    context = build_context(TlsFiles(str(pair.cert), str(pair.key)))
    assert isinstance(context, ServerContext) and context.client_timeout == 3.0
    context.client_timeout = 0.2
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        client_end.sendall(b"\x16\x03\x01\x02\x00")  # a ClientHello that never finishes
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            context.wrap_socket(server_end, server_side=True)
        assert time.monotonic() - started < 2.0


def tls_socketpair(context: ssl.SSLContext, ca: Path) -> tuple[ssl.SSLSocket, ssl.SSLSocket]:
    """A server and a client TLS socket connected to each other, handshakes done."""
    server_end, client_end = socket.socketpair()
    client: list[ssl.SSLSocket] = []
    thread = threading.Thread(
        target=lambda: client.append(client_context(ca).wrap_socket(client_end, server_hostname=HOST))
    )
    thread.start()
    server = context.wrap_socket(server_end, server_side=True)
    thread.join(5)
    return server, client[0]


def test_blocking_never_means_forever_on_a_server_connection(pair: certs.CertificatePaths) -> None:
    """gunicorn makes a kept-alive connection blocking before each request: a client that then sends
    half a request and goes silent must not hold the thread for good."""
    context = build_context(TlsFiles(str(pair.cert), str(pair.key)))
    context.client_timeout = 0.2  # type: ignore[attr-defined]
    server, client = tls_socketpair(context, pair.ca_cert)
    with server, client:
        server.setblocking(True)
        assert server.gettimeout() is None  # no socket timeout: CPython would poll before every write
        client.sendall(b"POST /validate HTTP/1.1\r\n")
        assert server.recv(100) == b"POST /validate HTTP/1.1\r\n"
        server.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert client.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        cut_before = connections_cut_off()
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"^no progress from the client in 0.2 s$"):
            server.recv(100)  # the rest never comes
        assert 0.15 < time.monotonic() - started < 2.0
        assert client.recv(100) == b""  # and the connection is over
        assert connections_cut_off() == cut_before + 1


def test_a_client_that_never_reads_cannot_hold_a_write(pair: certs.CertificatePaths) -> None:
    context = build_context(TlsFiles(str(pair.cert), str(pair.key)))
    context.client_timeout = 0.2  # type: ignore[attr-defined]
    server, client = tls_socketpair(context, pair.ca_cert)
    with server, client:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            server.sendall(b"x" * (64 << 20))  # far more than the socket buffers hold
        assert time.monotonic() - started < 3.0


def test_a_half_closed_connection_only_drains_what_already_arrived(pair: certs.CertificatePaths) -> None:
    """After the server's FIN, reads never wait: gunicorn lingers for the peer's FIN on its event loop,
    which a client that never closes would otherwise freeze for seconds per connection."""
    context = build_context(TlsFiles(str(pair.cert), str(pair.key)))
    server, client = tls_socketpair(context, pair.ca_cert)
    with server, client:
        server.shutdown(socket.SHUT_WR)
        server.settimeout(2.0)  # what gunicorn asks for while it lingers
        assert server.gettimeout() == 0.0
        started = time.monotonic()
        with pytest.raises(BlockingIOError):
            server.recv(4096)  # the client keeps its end open and sends nothing
        assert time.monotonic() - started < 0.5
