"""The reservation ledger: admitted GPU pods counted before the watch shows them.

A reservation is keyed by the pod UID the validating webhook sees. It stops counting as soon as the
watch cache has seen that pod (the cache counts it from then on, or it is gone), and expires after a
TTL when the pod never appears (another webhook refused it). Two stores keep the entries:
`InProcessStore` (one replica) and `ApiStore`, one ConfigMap per namespace written with resourceVersion
preconditions, so replicas never both take the last of a quota.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from webhook.core.admission.configmap_readers import NO_POD_READS, Reads
from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Allocation
from webhook.core.domain.names import LEDGER_LABEL, LEDGER_NAMESPACE_ANNOTATION, MANAGED_BY_LABEL
from webhook.core.podspec.record import allocation_from_json, allocation_to_json

from .watch import status_code

log = logging.getLogger(__name__)

T = TypeVar("T")
Entries = tuple["Reservation", ...]
# entries of one namespace -> (entries to write, or None to write nothing; the caller's result)
Change = Callable[[Entries], tuple[Entries | None, T]]


@dataclass(frozen=True)
class Reservation:
    uid: str
    namespace: str
    allocation: Allocation
    expires_at: float  # clock seconds (time.time() in production)
    # The pod's name and what it reads of ConfigMaps through envFrom (core/admission/configmap_readers.py `env_reads`):
    # a ConfigMap write is checked against the pod before the watch shows it. Written only when there
    # are reads; a replica that predates the field ignores it.
    pod: str = ""
    reads: frozenset[tuple[str, str, str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "uid": self.uid,
            "expiresAt": round(self.expires_at, 3),
            "allocation": allocation_to_json(self.allocation),
        }
        if self.reads:
            found["envFrom"] = {"pod": self.pod, "reads": [list(read) for read in sorted(self.reads)]}
        return found

    @classmethod
    def from_json(cls, namespace: str, data: Any) -> Reservation:
        if not isinstance(data, dict) or not isinstance(data.get("uid"), str):
            raise ValueError("reservation without a uid")
        expires = data.get("expiresAt")
        if not isinstance(expires, int | float):
            raise ValueError(f"reservation {data['uid']}: expiresAt is not a number")
        pod, reads = _env_from_json(data.get("envFrom"))
        return cls(data["uid"], namespace, allocation_from_json(data.get("allocation")), float(expires), pod, reads)

    def env_reads(self) -> Reads:
        """(namespace, pod, reads) as `Snapshot.env_readers` is built from (NO_POD_READS when none)."""
        return (self.namespace, self.pod, self.reads) if self.reads else NO_POD_READS


def _env_from_json(data: Any) -> tuple[str, frozenset[tuple[str, str, str]]]:
    """The optional envFrom field of an entry; one that does not read well counts as no reads (the
    entry still counts against quotas)."""
    if data is None:
        return "", frozenset()
    pod = data.get("pod") if isinstance(data, dict) else None
    raw = data.get("reads") if isinstance(data, dict) else None
    if isinstance(pod, str) and isinstance(raw, list) and all(
            isinstance(read, list) and len(read) == 3 and all(isinstance(part, str) for part in read) for read in raw):
        return pod, frozenset((a, b, c) for a, b, c in raw)
    log.warning("reservation ledger: unreadable envFrom reads ignored: %.200r", data)
    return "", frozenset()


class ReservationStore(Protocol):
    conflicts: int
    """Writes that lost to another replica (409) and were decided again; for metrics and tests."""

    def transact(self, namespace: str, change: Change[T]) -> T:
        """Run `change` on the namespace's entries and write its result atomically (retrying as needed)."""
        ...

    def known(self) -> Entries:
        """Every entry this process knows of, all namespaces, without calling anything remote."""
        ...

    @property
    def version(self) -> int:
        """Grows whenever `known()` may have changed (for caching views built from it)."""
        ...

    def reread(self, namespace: str) -> None:
        """Make `known()` hold the namespace's entries as the store has them now (other replicas'
        included); nothing to do for a store only this process writes."""
        ...


class InProcessStore:
    """Entries in this process's memory behind one lock: right for a single replica."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # `known()` is read from inside `transact`
        self._entries: dict[str, Entries] = {}
        self._version = 0
        self.conflicts = 0  # one process, one lock: never a lost write

    @property
    def version(self) -> int:
        return self._version

    def transact(self, namespace: str, change: Change[T]) -> T:
        with self._lock:
            new, result = change(self._entries.get(namespace, ()))
            if new is not None:
                if new:
                    self._entries[namespace] = new
                else:
                    self._entries.pop(namespace, None)
                self._version += 1
            return result

    def known(self) -> Entries:
        with self._lock:
            return tuple(entry for entries in self._entries.values() for entry in entries)

    def reread(self, namespace: str) -> None:
        pass  # every entry is this process's own


class ReservationStoreError(Exception):
    """The shared ledger could not be read or written; the admission cannot be recorded."""


class ReservationConflict(ReservationStoreError):
    """The shared ledger object kept changing under us; the admission cannot be recorded."""


@dataclass
class _Stored:
    resource_version: str | None  # None: the ConfigMap does not exist yet
    entries: Entries


class TimedConfigMaps:
    """The three ConfigMap calls of a kubernetes `CoreV1Api`, each with a request timeout, so that an API
    server that stops answering holds an admission for seconds, never for ever."""

    def __init__(self, api: Any, connect_seconds: float = 2.0, read_seconds: float = 3.0) -> None:
        self.api = api
        self.timeout = (connect_seconds, read_seconds)

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        return self.api.read_namespaced_config_map(name, namespace, _request_timeout=self.timeout)

    def create_namespaced_config_map(self, namespace: str, body: Any) -> Any:
        return self.api.create_namespaced_config_map(namespace, body, _request_timeout=self.timeout)

    def replace_namespaced_config_map(self, name: str, namespace: str, body: Any) -> Any:
        return self.api.replace_namespaced_config_map(name, namespace, body, _request_timeout=self.timeout)


class ApiStore:
    """One ConfigMap per namespace in the webhook's own namespace, replaced with a resourceVersion
    precondition; a 409 Conflict means another replica wrote first, so we re-read and decide again.

    Every transaction ends within `budget_seconds` (less than the webhook's timeoutSeconds, so that no
    reservation is written for a pod the API server has already given up on): waiting for this replica's
    turn, reading and writing included. Retries (409 Conflict, 429 Too Many Requests, 5xx, timeouts) back
    off exponentially with full jitter, so replicas that collided do not collide again in step; a ledger
    deleted under us (404 on replace) is created anew. `api` is a kubernetes `CoreV1Api` (or anything
    with its three ConfigMap methods), whose client should carry a request timeout (build_source's does).
    """

    DATA_KEY = "reservations"
    RETRIED = frozenset({409, 429, 500, 502, 503, 504})
    FIRST_BACKOFF = 0.005  # seconds; doubled per retry, up to MAX_BACKOFF, each wait drawn from [0, that]
    MAX_BACKOFF = 0.25

    def __init__(
        self,
        api: Any,
        namespace: str,
        *,
        prefix: str = "gpu-admission-ledger-",
        max_attempts: int = 50,
        budget_seconds: float = 3.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[float], float] = lambda top: random.uniform(0.0, top),
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.prefix = prefix
        self.max_attempts = max_attempts
        self.budget_seconds = budget_seconds
        self.clock, self.sleep, self.jitter = clock, sleep, jitter
        self.conflicts = 0
        self.retries = 0
        self.largest_write = 0  # bytes of the largest ledger written (the object limit is 1 MiB)
        self._stored: dict[str, _Stored] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def name_of(self, namespace: str) -> str:
        return f"{self.prefix}{namespace}"

    def known(self) -> Entries:
        with self._guard:
            return tuple(entry for stored in self._stored.values() for entry in stored.entries)

    def reread(self, namespace: str) -> None:
        # Under the namespace's lock, so that an older read never replaces what a write of ours just stored.
        with self._lock_of(namespace):
            self._guarded("read", namespace, self._read, namespace)

    def _lock_of(self, namespace: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(namespace, threading.Lock())

    def transact(self, namespace: str, change: Change[T]) -> T:
        # Threads of this replica take turns per namespace; other replicas are held off by the precondition.
        deadline = self.clock() + self.budget_seconds
        lock = self._lock_of(namespace)
        if not lock.acquire(timeout=self.budget_seconds):
            raise ReservationConflict(
                f"the reservation ledger of namespace {namespace} was busy for {self.budget_seconds:g} s"
            )
        try:
            return self._transact(namespace, change, deadline)
        finally:
            lock.release()

    def _transact(self, namespace: str, change: Change[T], deadline: float) -> T:
        stored = self._stored.get(namespace)
        for attempt in range(self.max_attempts):
            if stored is None:
                stored = self._guarded("read", namespace, self._read, namespace)
            new, result = change(stored.entries)
            if new is None:
                return result
            try:
                version = self._write(namespace, stored.resource_version, new)
            except Exception as error:
                code = status_code(error)
                if code == 404 and stored.resource_version is not None:
                    log.warning("%s was deleted: writing it anew", self._where(namespace))
                elif code not in self.RETRIED and not _timed_out(error):
                    raise ReservationStoreError(f"cannot write {self._where(namespace)}: {_brief(error)}") from error
                self.conflicts += code == 409
                self.retries += 1
                stored = None  # someone else wrote, or the write may not have landed: read again, decide again
                wait = self.jitter(min(self.MAX_BACKOFF, self.FIRST_BACKOFF * 2**attempt))
                if self.clock() + wait >= deadline:
                    raise ReservationConflict(
                        f"the reservation ledger of namespace {namespace} could not be written within "
                        f"{self.budget_seconds:g} s ({attempt + 1} tries, last: {_brief(error)})"
                    ) from error
                self.sleep(wait)
                continue
            self._remember(namespace, _Stored(version, new))
            return result
        raise ReservationConflict(
            f"the reservation ledger of namespace {namespace} kept changing ({self.max_attempts} tries)"
        )

    def _where(self, namespace: str) -> str:
        return f"ConfigMap {self.namespace}/{self.name_of(namespace)}"

    def _guarded(self, verb: str, namespace: str, call: Callable[[str], _Stored], *args: str) -> _Stored:
        try:
            return call(*args)
        except Exception as error:
            raise ReservationStoreError(f"cannot {verb} {self._where(namespace)}: {_brief(error)}") from error

    def _remember(self, namespace: str, stored: _Stored) -> None:
        with self._guard:
            before = self._stored.get(namespace)
            self._stored[namespace] = stored
            # The same object read again (a ConfigMap write's `reread`) keeps the views built on it.
            if before is None or before.resource_version is None or before.resource_version != stored.resource_version:
                self._version += 1

    def _read(self, namespace: str) -> _Stored:
        try:
            obj = self.api.read_namespaced_config_map(self.name_of(namespace), self.namespace)
        except Exception as error:
            if status_code(error) == 404:
                stored = _Stored(None, ())
                self._remember(namespace, stored)
                return stored
            raise
        stored = _Stored(obj.metadata.resource_version, self._decode(namespace, obj.data or {}))
        self._remember(namespace, stored)
        return stored

    def _decode(self, namespace: str, data: dict[str, str]) -> Entries:
        try:
            raw = json.loads(data.get(self.DATA_KEY) or "[]")
            return tuple(Reservation.from_json(namespace, item) for item in raw)
        except ValueError as error:  # a hand-edited object: start over rather than stop admitting
            log.error(
                "ledger %s/%s is unreadable (%s); treating it as empty", self.namespace, self.name_of(namespace), error
            )
            return ()

    def _write(self, namespace: str, resource_version: str | None, entries: Entries) -> str:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name_of(namespace),
                "namespace": self.namespace,
                "labels": {MANAGED_BY_LABEL: "gpu-admission", LEDGER_LABEL: "true"},
                "annotations": {LEDGER_NAMESPACE_ANNOTATION: namespace},
            },
            "data": {self.DATA_KEY: json.dumps([e.to_json() for e in entries], separators=(",", ":"))},
        }
        self.largest_write = max(self.largest_write, len(body["data"][self.DATA_KEY].encode()))
        if resource_version is None:
            created = self.api.create_namespaced_config_map(self.namespace, body)
            return str(created.metadata.resource_version)
        body["metadata"]["resourceVersion"] = resource_version
        replaced = self.api.replace_namespaced_config_map(self.name_of(namespace), self.namespace, body)
        return str(replaced.metadata.resource_version)


def _timed_out(error: BaseException) -> bool:
    """A request that got no answer in time (the client's timeout): it may or may not have landed."""
    name = type(error).__name__.lower()
    return isinstance(error, TimeoutError) or "timeout" in name or "timed out" in str(error).lower()


def _brief(error: BaseException) -> str:
    code = status_code(error)
    if code is not None:
        return f"HTTP {code} {getattr(error, 'reason', '') or ''}".rstrip()
    return str(error).splitlines()[0] if str(error) else type(error).__name__


class Ledger:
    """Records admitted pods in a store and says which reservations still count.

    An entry counts until it expires; `horizon` is the time up to which expiry may be judged (the
    caller passes when its pod watch last heard from the server, so that a reservation never lapses
    while the watch could not have shown the pod). `droppable(entry)` says when an entry may be
    deleted from the store for good, which for a shared store must wait until every replica agrees.
    """

    def __init__(
        self,
        store: ReservationStore | None = None,
        *,
        ttl_seconds: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store: ReservationStore = store or InProcessStore()
        self.ttl_seconds = ttl_seconds
        self.clock = clock

    def reread(self, namespace: str) -> None:
        """Read the namespace's entries again where other replicas write them too (raises
        ReservationStoreError when the store cannot be read)."""
        reread = getattr(self.store, "reread", None)
        if reread is not None:
            reread(namespace)

    def active(self, horizon: float | None = None) -> Entries:
        """Entries this process knows of (every namespace) that have not expired by `horizon` (now)."""
        limit = self.clock() if horizon is None else horizon
        return tuple(e for e in self.store.known() if e.expires_at > limit)

    def commit(
        self,
        uid: str,
        namespace: str,
        decide: Callable[[Entries], Decision],
        dry_run: bool,
        *,
        horizon: Callable[[], float] | None = None,
        droppable: Callable[[Reservation], bool] = lambda entry: False,
        reads: Callable[[], Reads] | None = None,
    ) -> Decision:
        """Decide with the namespace's other unexpired entries and, when allowed, record the pod.

        `decide` gets the entries (without this pod's own, so a retried call is not counted twice) and
        may be called again when another replica wrote first. `reads`: the pod's envFrom reads
        (core/admission/configmap_readers.py `env_reads`), asked for only when the pod is recorded.
        """
        found: list[Reads] = []

        def change(entries: Entries) -> tuple[Entries | None, Decision]:
            now = self.clock()
            limit = now if horizon is None else horizon()
            others = tuple(e for e in entries if e.uid != uid)
            decision = decide(tuple(e for e in others if e.expires_at > limit))
            if dry_run or not uid or not decision.allowed or decision.allocation is None:
                return None, decision
            if reads is not None and not found:
                found.append(reads())
            _, pod, read = found[0] if found else NO_POD_READS
            mine = Reservation(uid, namespace, decision.allocation, now + self.ttl_seconds, pod, read)
            return tuple(e for e in others if not droppable(e)) + (mine,), decision

        return self.store.transact(namespace, change)

    def prune(self, droppable: Callable[[Reservation], bool]) -> int:
        """Delete droppable entries from the store; returns how many went."""
        dropped = 0
        for namespace in sorted({e.namespace for e in self.store.known()}):

            def change(entries: Entries) -> tuple[Entries | None, int]:
                kept = tuple(e for e in entries if not droppable(e))
                return (kept if len(kept) != len(entries) else None), len(entries) - len(kept)

            dropped += self.store.transact(namespace, change)
        return dropped
