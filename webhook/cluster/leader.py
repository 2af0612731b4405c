"""One decider among the replicas: a coordination.k8s.io Lease, judged by this process's own clock.

Replicas share nothing per pod. The leader keeps the reservations in memory, as a single replica does;
the others answer the API server by forwarding each review to it (server/peer.py). The Lease says who
leads and where it listens (the PEER_ANNOTATION).

Time is only ever compared on one process's monotonic clock, never between replicas, so clock skew
cannot hand the lease over early:
- the leader decides only while its last successful renewal is less than `renew_deadline` old by its
  own clock; past that it stops, even if the API server is unreachable and it cannot tell anyone;
- a follower takes the lease over only when it has seen no renewal (no new resourceVersion) for
  `lease_seconds` by its own clock, longer than the renew deadline;
- a new leader waits `takeover_wait` (the webhooks' timeoutSeconds) before deciding: answers its
  predecessor gave before stopping have reached etcd, and the watch, by then.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger(__name__)

LEASE_NAME = "gpu-admission-decider"
PEER_ANNOTATION = "gpu-admission.io/peer"
LEASE_SECONDS = 15.0
RENEW_DEADLINE = 10.0
RETRY_SECONDS = 2.0


class LeaseConflict(Exception):
    """The write lost to another replica's (409), or the Lease is gone (404)."""


class LeaseApi(Protocol):
    def read(self) -> Mapping[str, Any] | None: ...

    def create(self, body: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def replace(self, body: Mapping[str, Any]) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Leadership:
    """What the server needs to know to answer a review: decide here, forward to `peer`, or wait."""

    leader: bool
    deciding: bool
    peer: str | None  # the leader's URL for forwarded reviews; None when unknown or this replica
    holder: str = ""

    def why_not(self) -> str:
        if self.leader:
            return "this replica just became the GPU admission decider and waits out its predecessor's answers"
        return "no GPU admission decider is elected yet"


class LeaseElector:
    def __init__(
        self,
        api: LeaseApi,
        identity: str,
        peer_url: str,
        *,
        takeover_wait: float = 5.0,
        lease_seconds: float = LEASE_SECONDS,
        renew_deadline: float = RENEW_DEADLINE,
        retry_seconds: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        on_elected: Callable[[], None] | None = None,
        eligible: Callable[[], bool] = lambda: True,
    ) -> None:
        if not retry_seconds < renew_deadline < lease_seconds:
            raise ValueError("retry period < renew deadline < lease duration, or a leader could overlap the next")
        self.api = api
        self.identity = identity
        self.peer_url = peer_url
        self.takeover_wait = takeover_wait
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_seconds = retry_seconds
        self.clock = clock
        self.on_elected = on_elected
        self.eligible = eligible  # a replica whose picture is unfit (watch unsynced or stale) never leads
        self.transitions = 0  # times this replica became leader
        self.largest_write = 0  # bytes of the largest Lease body written (a constant, whatever the pods)
        self._lock = threading.Lock()
        self._renewed: float | None = None  # last successful renewal while holding the lease
        self._deciding_from = 0.0
        self._observed: tuple[str, str] | None = None  # (holder, resourceVersion) last seen from another
        self._observed_at = 0.0
        self._holder = ""
        self._peer: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the server asks ------------------------------------------------------------------

    def state(self) -> Leadership:
        now = self.clock()
        with self._lock:
            leader = self._renewed is not None and now - self._renewed < self.renew_deadline
            deciding = leader and now >= self._deciding_from
            peer = None if leader or self._holder == self.identity else self._peer
            return Leadership(leader, deciding, peer, self._holder)

    # -- the election loop -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.retry_seconds + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # never let the loop die: leadership then lapses by the renew deadline
                log.exception("leader election round failed")
            self._stop.wait(self.retry_seconds)

    def step(self) -> None:
        """One round: create, renew or take over the Lease, or note who holds it."""
        now = self.clock()
        try:
            lease = self.api.read()
            fit = self.eligible()
            if lease is None:
                if fit:
                    self._won(self.api.create(self._body(None, 0)), now, fresh=True)
                return
            spec = _mapping(lease.get("spec"))
            holder = str(spec.get("holderIdentity") or "")
            version = str(_mapping(lease.get("metadata")).get("resourceVersion") or "")
            if holder == self.identity and fit:
                renewed = self.api.replace(self._body(lease, int(spec.get("leaseTransitions") or 0)))
                self._won(renewed, now, fresh=self.state().leader is False)
                return
            with self._lock:
                if self._observed != (holder, version):
                    self._observed, self._observed_at = (holder, version), now
                self._holder = holder
                self._peer = _peer_of(lease)
                self._renewed = None  # another holds it: never decide here
                expired = not holder or now - self._observed_at >= self.lease_seconds
            if expired and fit and holder != self.identity:
                taken = self.api.replace(self._body(lease, int(spec.get("leaseTransitions") or 0) + 1))
                log.warning("took over the GPU admission decider lease from %r", holder or "nobody")
                self._won(taken, now, fresh=True)
        except LeaseConflict:
            return  # another replica wrote first: read again next round
        except Exception as error:  # API unreachable, timed out: leadership lapses on its own
            log.warning("leader election: %s", error)

    def _won(self, lease: Mapping[str, Any], now: float, *, fresh: bool) -> None:
        with self._lock:
            self._renewed = now
            self._holder = self.identity
            self._peer = None
            if fresh:
                self._deciding_from = now + self.takeover_wait
                self.transitions += 1
        if fresh:
            log.warning("became the GPU admission decider; deciding in %.0f s", self.takeover_wait)
            if self.on_elected is not None:
                self.on_elected()

    def _body(self, lease: Mapping[str, Any] | None, transitions: int) -> dict[str, Any]:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # for people reading it; never compared
        metadata: dict[str, Any] = dict(_mapping(lease.get("metadata"))) if lease else {"name": LEASE_NAME}
        metadata["annotations"] = {**_mapping(metadata.get("annotations")), PEER_ANNOTATION: self.peer_url}
        spec = dict(_mapping(lease.get("spec"))) if lease else {}
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = stamp
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(self.lease_seconds), renewTime=stamp,
                     leaseTransitions=transitions)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
        self.largest_write = max(self.largest_write, len(json.dumps(body)))
        return body


def _peer_of(lease: Mapping[str, Any]) -> str | None:
    value = _mapping(_mapping(lease.get("metadata")).get("annotations")).get(PEER_ANNOTATION)
    return value if isinstance(value, str) and value.startswith("https://") else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class KubeLeases:
    """LeaseApi over the Kubernetes client: JSON in and out, a request timeout on every call."""

    def __init__(self, api_client: Any, namespace: str, name: str = LEASE_NAME, timeout: float = 3.0) -> None:
        from kubernetes import client

        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.timeout = namespace, name, timeout

    def read(self) -> Mapping[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            return self._json(self.api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self.timeout))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def create(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        payload: Any = body
        return self._write(lambda: self.api.create_namespaced_lease(
            self.namespace, payload, _preload_content=False, _request_timeout=self.timeout))

    def replace(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        payload: Any = body
        return self._write(lambda: self.api.replace_namespaced_lease(
            self.name, self.namespace, payload, _preload_content=False, _request_timeout=self.timeout))

    def _write(self, call: Callable[[], Any]) -> Mapping[str, Any]:
        from kubernetes.client.rest import ApiException

        try:
            return self._json(call())
        except ApiException as error:
            if error.status in (404, 409):
                raise LeaseConflict(str(error.reason)) from None
            raise

    @staticmethod
    def _json(response: Any) -> Mapping[str, Any]:
        import json

        data = json.loads(response.data)
        return data if isinstance(data, dict) else {}
