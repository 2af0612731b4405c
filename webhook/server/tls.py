"""Server TLS: one SSLContext, rebuilt when the certificate files change on disk.

gunicorn asks for a context on every new connection (its `ssl_context` hook); `ReloadingContext` answers
from a cached context and rebuilds it when `tls.crt`, `tls.key` or the client CA change, so a renewed
certificate (cert-manager, the chart's Job) takes effect for new connections with no restart.
A half-written pair (new certificate, old key) fails to load and leaves the previous context in use.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("webhook.server.tls")

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
# Forward-secret AEAD suites only for TLS 1.2 (TLS 1.3 suites are fixed by OpenSSL and all strong).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
HANDSHAKE_TIMEOUT = 3.0  # seconds; the API server completes a handshake in milliseconds


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    client_ca: str | None = None
    """When set, clients must present a certificate signed by this CA."""
    min_version: str = "1.2"


class ServerContext(ssl.SSLContext):
    """A server context whose handshakes time out: a client that connects and stalls mid-handshake
    would otherwise hold one of the worker's threads for as long as it likes."""

    handshake_timeout: float = HANDSHAKE_TIMEOUT

    def wrap_socket(self, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        if sock.gettimeout() is None:
            sock.settimeout(self.handshake_timeout)  # also bounds the reads of the first request
        return super().wrap_socket(sock, *args, **kwargs)


def build_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context: TLS 1.2+ (or 1.3+), strong ciphers, optional client-certificate verification."""
    if files.min_version not in TLS_VERSIONS:
        raise ValueError(f"unsupported minimum TLS version {files.min_version!r}: expected 1.2 or 1.3")
    context = ServerContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[files.min_version]
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.load_cert_chain(certfile=files.cert_file, keyfile=files.key_file)
    if files.client_ca:
        context.load_verify_locations(cafile=files.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


class ReloadingContext:
    """The current context; each call checks the files' stamps (a few stat calls) and rebuilds on change."""

    def __init__(self, files: TlsFiles, builder: Callable[[TlsFiles], ssl.SSLContext] = build_context) -> None:
        self.files = files
        self._builder = builder
        self._lock = threading.Lock()
        self._stamp = self._stamps()
        self._context = builder(files)  # fails loudly at start-up: no serving without a valid pair
        self._failed: tuple[tuple[int, int, int] | None, ...] | None = None
        self.reloads = 0

    def context(self) -> ssl.SSLContext:
        stamp = self._stamps()
        if stamp == self._stamp or stamp == self._failed:
            return self._context
        with self._lock:
            if stamp != self._stamp and stamp != self._failed:
                try:
                    context = self._builder(self.files)
                except (OSError, ssl.SSLError, ValueError) as err:
                    # Retried once the files change again (e.g. the key lands after the certificate).
                    self._failed = stamp
                    log.warning(
                        "certificate files changed but do not load, still serving the previous ones: %s",
                        " ".join(str(err).split()),
                    )
                else:
                    self._context, self._stamp, self._failed = context, stamp, None
                    self.reloads += 1
                    log.info("serving certificate reloaded from %s", self.files.cert_file)
        return self._context

    def gunicorn_hook(self, _config: object, _default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        """gunicorn's `ssl_context(config, default_ssl_context_factory)` setting."""
        return self.context()

    def _stamps(self) -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(_stamp(p) for p in (self.files.cert_file, self.files.key_file, self.files.client_ca))


def _stamp(path: str | None) -> tuple[int, int, int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
