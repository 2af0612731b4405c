"""Server TLS: one SSLContext, rebuilt when the certificate files change on disk.

gunicorn asks for a context on every new connection (its `ssl_context` hook); `ReloadingContext` answers
from a cached context and rebuilds it when `tls.crt`, `tls.key` or the client CA change, so a renewed
certificate (cert-manager, the chart's Job) takes effect for new connections with no restart.
A half-written pair (new certificate, old key) fails to load and leaves the previous context in use.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("webhook.server.tls")

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
# Forward-secret AEAD suites only for TLS 1.2 (TLS 1.3 suites are fixed by OpenSSL and all strong).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
CLIENT_TIMEOUT = 3.0
"""Seconds a client may make no progress mid-handshake, mid-request or while taking its answer; the API
server does each in milliseconds."""


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    client_ca: str | None = None
    """When set, clients must present a certificate signed by this CA."""
    min_version: str = "1.2"


class _Overdue:
    """The blocking TLS operations in progress, each with its deadline, and a thread that cuts off the
    connections whose operation is overdue.

    A socket timeout would bound them too, but on a socket with a timeout CPython polls before every TLS
    write, giving up the GIL once more each time: about 5 % more CPU per admission, measured.
    """

    TICK = 0.25  # seconds between two looks: a stalled client is cut off within its timeout plus this

    def __init__(self) -> None:
        # Set and popped by the request threads, read by the deadline thread: each dict operation is
        # atomic under the GIL, so the hot path takes no lock.
        self._due: dict[TimedSSLSocket, float] = {}
        self._thread: threading.Thread | None = None
        self._spawning = threading.Lock()
        self.cut = 0
        """Connections cut off so far (written by the deadline thread only)."""
        os.register_at_fork(after_in_child=self._forget)

    def watch(self, sock: TimedSSLSocket, seconds: float) -> None:
        """Until `done`: cut the connection off once `seconds` have passed."""
        self._due[sock] = time.monotonic() + seconds
        if self._thread is None:
            self._spawn()

    def done(self, sock: TimedSSLSocket) -> None:
        self._due.pop(sock, None)

    def _spawn(self) -> None:
        with self._spawning:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="tls-deadlines", daemon=True)
                thread.start()
                self._thread = thread

    def _forget(self) -> None:
        """In a forked worker: no thread yet, nothing in progress."""
        self._thread, self._due, self._spawning, self.cut = None, {}, threading.Lock(), 0

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK)
            now = time.monotonic()
            for sock, due in list(self._due.items()):
                if due <= now and self._due.pop(sock, None) is not None:
                    self.cut += 1  # counted first: the woken operation may be answered before this thread runs on
                    sock.cut_off()


_OVERDUE = _Overdue()


def connections_cut_off() -> int:
    """Client connections this process cut off for making no progress (a metric)."""
    return _OVERDUE.cut


class TimedSSLSocket(ssl.SSLSocket):
    """A server-side TLS socket that never waits on its client for long.

    gunicorn's threaded worker makes a kept-alive connection blocking before each request: a client that
    sent half a request and went silent would hold one of the worker's few threads for good. Here every
    handshake, read and write that waits longer than the context's `client_timeout` is cut off and
    raises TimeoutError. And once the server has half-closed the connection, it only takes what the peer
    already sent: gunicorn waits for the peer's FIN on its event loop, which a client that never closes
    would freeze for 2 s per connection.
    """

    _half_closed = False
    _cut = False

    def do_handshake(self, block: bool = False) -> None:
        self._watched(super().do_handshake, block)

    def read(self, len: int = 1024, buffer: Any = None) -> Any:  # noqa: A002 (the name ssl.SSLSocket uses)
        return self._watched(super().read, len, buffer)

    def send(self, data: Any, flags: int = 0) -> int:
        if self._cut:  # an answer to a client that was cut off (the app's 408): it can no longer go out
            raise BrokenPipeError(errno.EPIPE, "connection cut off: the client made no progress")
        sent: int = self._watched(super().send, data, flags)
        return sent

    def settimeout(self, value: float | None) -> None:
        super().settimeout(0.0 if self._half_closed else value)

    def shutdown(self, how: int) -> None:
        super().shutdown(how)
        self._half_closed = True

    def cut_off(self) -> None:
        """Called by the deadline thread: wake the blocked operation, which then raises TimeoutError.
        The TLS session cannot go on after that: the connection is over."""
        self._cut = True
        with contextlib.suppress(OSError):  # already closed
            socket.socket.shutdown(self, socket.SHUT_RDWR)

    def _watched(self, operation: Callable[..., Any], *args: Any) -> Any:
        seconds = getattr(self.context, "client_timeout", CLIENT_TIMEOUT)
        _OVERDUE.watch(self, seconds)
        try:
            result = operation(*args)
        except OSError:
            if not self._cut:
                raise
        finally:
            _OVERDUE.done(self)
        if self._cut:  # woken by cut_off: whatever the operation saw (an end, an error), the client stalled
            raise TimeoutError(f"no progress from the client in {seconds:g} s")
        return result


class ServerContext(ssl.SSLContext):
    """A server context whose connections time out: a client that stalls mid-handshake or mid-request
    is dropped after `client_timeout` seconds instead of holding a worker thread."""

    client_timeout: float = CLIENT_TIMEOUT
    sslsocket_class = TimedSSLSocket


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
        # Optional at the handshake, so that the kubelet's probes (which present none) still connect; a
        # certificate that is sent must verify, and the admission endpoints refuse a caller without one.
        context.load_verify_locations(cafile=files.client_ca)
        context.verify_mode = ssl.CERT_OPTIONAL
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
