"""Prometheus metrics of one app, in its own registry (two apps in one process never collide).

Request metrics are updated as admissions happen; cluster gauges (quota, GPUs, snapshot age and
staleness, certificate expiry) are computed from the snapshot source when Prometheus scrapes.
"""

from __future__ import annotations

import collections
import datetime
import os
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from webhook.core.domain.model import QuotaLimits, Snapshot
from webhook.core.domain.names import QUOTA_CORES, QUOTA_GPUS, QUOTA_MEMORY
from webhook.core.placement.mixlearn import mix_in_use
from webhook.core.policy.model import Policy

from .source import SnapshotSource
from .tls import CLIENT_TIMEOUT, connections_cut_off

# Admissions answer in milliseconds; the API server gives up after its timeout (5 s in the chart).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
QUOTA_KEYS = (
    ("gpus", QUOTA_GPUS),
    ("memory_mib", QUOTA_MEMORY),
    ("cores", QUOTA_CORES),
)


class AdmissionMetrics:
    """The request-side metrics; `exposition()` renders everything registered, cluster gauges included."""

    def __init__(self, source: SnapshotSource, cert_file: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.duration = Histogram(
            "gpu_admission_admission_duration_seconds",
            "Time to answer an admission request, by endpoint and result (allowed, denied, error, rejected).",
            ["endpoint", "result"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "gpu_admission_decisions_total",
            "Admission answers by endpoint, verdict and reason.",
            ["endpoint", "verdict", "reason"],
            registry=self.registry,
        )
        # One entry per request being answered: deque.append and .pop are atomic and run no Python code,
        # unlike a Gauge's locked inc() and dec() on every request. Read when scraped.
        self.in_flight: collections.deque[None] = collections.deque()
        Gauge(
            "gpu_admission_requests_in_flight",
            "Admission requests being answered now.",
            registry=self.registry,
        ).set_function(lambda: len(self.in_flight))
        self.errors = Counter(
            "gpu_admission_errors_total",
            "Unexpected exceptions while deciding, answered as a denial with code 500.",
            ["endpoint"],
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "gpu_admission_bad_requests_total",
            "Malformed requests answered with an HTTP 4xx, by endpoint and status.",
            ["endpoint", "code"],
            registry=self.registry,
        )
        self.forwarded = Counter(
            "gpu_admission_forwarded_total",
            "Reviews this replica forwarded to the elected decider, by endpoint and the decider's HTTP status.",
            ["endpoint", "code"],
            registry=self.registry,
        )
        self.policy_reload_failures = Counter(
            "gpu_admission_policy_reload_failures_total",
            "Policy file changes that could not be loaded (the previous policy stays in force).",
            registry=self.registry,
        )
        self.policy: Callable[[], Policy] = Policy  # the policy in force (the app sets its holder's)
        self.registry.register(ClusterCollector(source, cert_file, lambda: self.policy()))
        self.registry.register(CutOffCollector())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class CutOffCollector(Collector):
    """Client connections the TLS layer cut off, read from it when scraped."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "gpu_admission_connections_cut_off",
            f"Client connections cut off after making no progress for {CLIENT_TIMEOUT:g} s (stalled"
            " mid-handshake, mid-request or while taking the answer): misbehaving clients or a lossy network.",
            value=float(connections_cut_off()),
        )

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())


class ClusterCollector(Collector):
    """Gauges read from the snapshot at scrape time, so they are never out of date."""

    def __init__(self, source: SnapshotSource, cert_file: str | None,
                 policy: Callable[[], Policy] = Policy) -> None:
        self._source = source
        self._policy = policy
        self._expiry = CertificateExpiry(cert_file) if cert_file else None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for name, method, text in (
            ("gpu_admission_reservations", "reservation_count",
             "Admitted pods the watch has not shown yet, held by this replica's reservations."),
            ("gpu_admission_largest_written_object_bytes", "largest_written",
             "Bytes of the largest state object this replica wrote (a ledger ConfigMap's data, or the decider's"
             " Lease); the API server refuses objects over 1 MiB."),
        ):
            read = getattr(self._source, method, None)
            if callable(read):
                family = GaugeMetricFamily(name, text)
                family.add_metric([], float(read()))
                yield family
        age = GaugeMetricFamily("gpu_admission_snapshot_age_seconds", "Seconds since the cluster picture changed.")
        age.add_metric([], self._source.age_seconds())
        yield age
        stale = GaugeMetricFamily(
            "gpu_admission_cache_stale",
            "1 while the source says its cluster picture is stale (a silent watch), else 0.",
        )
        stale.add_metric([], 1.0 if source_is_stale(self._source) else 0.0)
        yield stale
        conflicts = getattr(self._source, "reservation_conflicts", None)
        if callable(conflicts):  # a live source: replicas sharing the reservation store
            yield CounterMetricFamily(
                "gpu_admission_reservation_conflicts",
                "Reservation writes that lost to another replica (409 Conflict) and were decided again.",
                value=float(conflicts()),
            )
        outcomes = getattr(self._source, "group_outcomes", None)
        if callable(outcomes):  # a source that records multi-pod groups (core/groups.py)
            groups = CounterMetricFamily(
                "gpu_admission_groups",
                "Multi-pod groups by how they were placed: whole (one domain with room for all), split (preferred"
                " mode: no domain could hold it, its pods spread) and waiting (no room now: refused, or waiting"
                " in its busy domain).",
                labels=["outcome"],
            )
            for outcome, count in sorted(outcomes().items()):
                groups.add_metric([outcome], float(count))
            yield groups
        snapshot = self._source.snapshot()
        yield from quota_metrics(snapshot)
        yield from gpu_metrics(snapshot)
        policy = self._policy()
        yield mix_metric(snapshot, policy if isinstance(policy, Policy) else Policy())  # test doubles too
        if self._expiry is not None:
            remaining = self._expiry.seconds_left()
            if remaining is not None:
                cert = GaugeMetricFamily(
                    "gpu_admission_certificate_expiry_seconds",
                    "Seconds until the serving certificate expires (negative once expired).",
                )
                cert.add_metric([], remaining)
                yield cert

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


def source_is_stale(source: SnapshotSource) -> bool:
    """The source's own `stale()` when it has one; else what its readiness says: not ready because stale.

    A source that is not ready for another reason (still loading) is not stale.
    """
    stale = getattr(source, "stale", None)
    if callable(stale):
        return bool(stale())
    ready, why = source.ready()
    return not ready and "stale" in why.lower()


def mix_metric(snapshot: Snapshot, policy: Policy) -> GaugeMetricFamily:
    """The fragmentation policy's workload mix: one series per shape (at most mixlearn.MAX_SHAPES)."""
    source, mix = mix_in_use(policy, snapshot)
    family = GaugeMetricFamily(
        "gpu_admission_workload_mix_weight",
        "Weight of each pod shape in the fragmentation policy's workload mix (they sum to 1), and where the"
        " mix comes from: learned from the GPU pods the cluster holds, fixed by the policy, or the default.",
        labels=["source", "gpus", "milli", "cpu_milli", "memory_mib", "models"],
    )
    for shape in mix:
        labels = [source, str(shape.gpus), str(shape.milli), str(shape.cpu_milli), str(shape.memory_mib),
                  ",".join(shape.models)]
        family.add_metric(labels, shape.weight)
    return family


def quota_metrics(snapshot: Snapshot) -> Iterator[GaugeMetricFamily]:
    used = GaugeMetricFamily(
        "gpu_admission_quota_used",
        "GPU quota used per namespace and quota key.",
        labels=["namespace", "resource"],
    )
    limit = GaugeMetricFamily(
        "gpu_admission_quota_limit",
        "GPU quota limit per namespace and quota key (the tightest ResourceQuota).",
        labels=["namespace", "resource"],
    )
    for namespace in sorted(snapshot.quotas):
        quotas = snapshot.quotas[namespace]
        usage = snapshot.namespace_usage.get(namespace)
        for field_name, key in QUOTA_KEYS:
            tightest = _tightest(quotas, field_name)
            if tightest is None:
                continue
            limit.add_metric([namespace, key], tightest)
            used.add_metric([namespace, key], getattr(usage, field_name, 0) if usage else 0)
    yield used
    yield limit


def gpu_metrics(snapshot: Snapshot) -> Iterator[GaugeMetricFamily]:
    allocated: dict[str, int] = {}
    free: dict[str, int] = {}
    for name, node in snapshot.nodes.items():
        node_usage = snapshot.usage.get(name)
        for position, gpu in enumerate(node.gpus):
            busy = False
            if node_usage is not None and position < len(node_usage.gpus):
                u = node_usage.gpus[position]
                busy = u.exclusive or u.tasks > 0 or u.memory_mib > 0 or u.cores > 0
            allocated.setdefault(gpu.model, 0)
            free.setdefault(gpu.model, 0)
            if busy:
                allocated[gpu.model] += 1
            elif gpu.healthy and not node.unschedulable:
                free[gpu.model] += 1
    family_allocated = GaugeMetricFamily(
        "gpu_admission_gpus_allocated",
        "GPUs with at least one task or reservation, per model.",
        labels=["model"],
    )
    family_free = GaugeMetricFamily(
        "gpu_admission_gpus_free",
        "Healthy GPUs on schedulable nodes with nothing on them, per model.",
        labels=["model"],
    )
    for model in sorted(allocated):
        family_allocated.add_metric([model], allocated[model])
        family_free.add_metric([model], free[model])
    yield family_allocated
    yield family_free


def _tightest(quotas: tuple[QuotaLimits, ...], field_name: str) -> int | None:
    values = [getattr(q, field_name) for q in quotas if getattr(q, field_name) is not None]
    return min(values) if values else None


class CertificateExpiry:
    """Reads the serving certificate's notAfter, again only when the file changes."""

    def __init__(self, path: str, now: Callable[[], datetime.datetime] | None = None) -> None:
        self._path = path
        self._now = now or (lambda: datetime.datetime.now(datetime.UTC))
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._not_after: datetime.datetime | None = None

    def seconds_left(self) -> float | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._not_after = _not_after(self._path)
                self._stamp = stamp
            not_after = self._not_after
        if not_after is None:
            return None
        return (not_after - self._now()).total_seconds()


def _not_after(path: str) -> datetime.datetime | None:
    from cryptography import x509

    try:
        with open(path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError):
        return None
    return cert.not_valid_after_utc
