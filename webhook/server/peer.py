"""Reviews forwarded between replicas: a replica that is not the elected decider (cluster/leader.py)
sends each review it gets to the one that is, and relays its answer to the API server.

The decider's /peer/ paths take only reviews signed with the record key, which every replica of one
webhook holds (the chart's Secret) and no tenant does: a forwarded review cannot be forged from a pod
that reaches the Service. Peers present the webhook's own serving certificate, which is what the
forwarding side trusts (its hostname is a pod address, never checked).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ssl
import threading
import time
from typing import Protocol
from urllib.parse import urlsplit

PEER_HEADER = "X-GPU-Admission-Peer"
PEER_PATHS = {"/peer/mutate": "mutate", "/peer/validate": "validate"}


class Leadership(Protocol):
    """What a source with an elected decider says (cluster/leader.py `Leadership`)."""

    @property
    def deciding(self) -> bool: ...

    @property
    def peer(self) -> str | None: ...

    def why_not(self) -> str: ...


def signature(key: bytes, endpoint: str, body: bytes) -> str:
    return hmac.new(key, endpoint.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def signed(key: bytes | tuple[bytes, ...], endpoint: str, body: bytes, given: str | None) -> bool:
    """Whether `given` signs the review under the key, or any key a rotation keeps (a tuple)."""
    keys = key if isinstance(key, tuple) else (key,)
    return bool(given) and any(hmac.compare_digest(signature(k, endpoint, body), str(given)) for k in keys)


class PeerError(Exception):
    """The decider could not be reached or did not answer in time."""


class PeerClient:
    """Keep-alive HTTPS connections to the decider, one per thread, verified against `trust` (PEM files:
    the serving certificate every replica shares, and its CA when there is one)."""

    def __init__(self, key: bytes, trust: list[str], timeout: float = 3.5) -> None:
        self.key = key
        self.timeout = timeout
        context = ssl.create_default_context()
        context.check_hostname = False  # a pod address; the certificate itself is what is trusted
        for path in trust:
            context.load_verify_locations(path)
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the shared leaf itself is a trust anchor
        self.context = context
        self._local = threading.local()

    def forward(self, peer: str, endpoint: str, body: bytes, content_type: str | None) -> tuple[int, bytes]:
        """POST the review to the decider's /peer/<endpoint>; (HTTP status, body) of its answer. One retry
        on a fresh connection when a kept-alive one turns out closed."""
        headers = {"Content-Type": content_type or "application/json",
                   PEER_HEADER: signature(self.key, endpoint, body)}
        deadline = time.monotonic() + self.timeout
        for attempt in (0, 1):
            conn = self._connection(peer, fresh=attempt == 1)
            conn.timeout = max(deadline - time.monotonic(), 0.05)
            try:
                conn.request("POST", f"/peer/{endpoint}", body=body, headers=headers)
                answer = conn.getresponse()
                return answer.status, answer.read()
            except (OSError, http.client.HTTPException) as error:
                conn.close()
                if attempt == 1 or time.monotonic() >= deadline:
                    raise PeerError(f"the GPU admission decider at {peer} did not answer: {error}") from None
        raise AssertionError("unreachable")

    def _connection(self, peer: str, fresh: bool) -> http.client.HTTPSConnection:
        pool: dict[str, http.client.HTTPSConnection] = getattr(self._local, "pool", None) or {}
        self._local.pool = pool
        conn = pool.get(peer)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            parts = urlsplit(peer)
            conn = http.client.HTTPSConnection(parts.hostname or "", parts.port or 443, context=self.context,
                                               timeout=self.timeout)
            pool[peer] = conn
        return conn
