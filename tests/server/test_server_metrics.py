"""Cluster gauges computed at scrape time: quota, GPUs per model, snapshot age, certificate expiry."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from server_support import samples

from webhook.certs import authority as certs
from webhook.core.domain.model import Gpu, GpuUsage, Node, NodeUsage, QuotaLimits, Snapshot, Usage
from webhook.server import tls
from webhook.server.metrics import AdmissionMetrics, CertificateExpiry
from webhook.server.source import StaticSource


def cluster() -> Snapshot:
    h100 = tuple(Gpu(i, f"GPU-{i}", "H100", 81559) for i in range(4))
    a100 = (Gpu(0, "GPU-a", "A100", 40960), Gpu(1, "GPU-b", "A100", 40960, healthy=False))
    return Snapshot(
        nodes={"n1": Node("n1", h100), "n2": Node("n2", a100)},
        usage={
            "n1": NodeUsage(gpus=(GpuUsage(81559, 100, 1, True), GpuUsage(1000, 20, 1), GpuUsage(), GpuUsage())),
            "n2": NodeUsage(gpus=(GpuUsage(), GpuUsage())),
        },
        quotas={
            "team-a": (QuotaLimits("a", gpus=8, memory_mib=100000), QuotaLimits("b", gpus=4)),
            "team-b": (QuotaLimits("c", cores=400),),
        },
        namespace_usage={"team-a": Usage(2, 82559, 120)},
    )


def test_quota_and_gpu_gauges() -> None:
    now = [10.0]
    metrics = AdmissionMetrics(StaticSource(cluster(), clock=lambda: now[0]))
    now[0] = 14.0
    assert samples(metrics, "gpu_admission_quota_limit") == {
        (("namespace", "team-a"), ("resource", "requests.nvidia.com/gpu")): 4.0,  # the tightest quota
        (("namespace", "team-a"), ("resource", "limits.nvidia.com/gpumem")): 100000.0,
        (("namespace", "team-b"), ("resource", "limits.nvidia.com/gpucores")): 400.0,
    }
    assert samples(metrics, "gpu_admission_quota_used") == {
        (("namespace", "team-a"), ("resource", "requests.nvidia.com/gpu")): 2.0,
        (("namespace", "team-a"), ("resource", "limits.nvidia.com/gpumem")): 82559.0,
        (("namespace", "team-b"), ("resource", "limits.nvidia.com/gpucores")): 0.0,
    }
    assert samples(metrics, "gpu_admission_gpus_allocated") == {(("model", "A100"),): 0.0, (("model", "H100"),): 2.0}
    assert samples(metrics, "gpu_admission_gpus_free") == {(("model", "A100"),): 1.0, (("model", "H100"),): 2.0}
    assert samples(metrics, "gpu_admission_snapshot_age_seconds") == {(): 4.0}
    assert samples(metrics, "gpu_admission_certificate_expiry_seconds") == {}


def test_reservations_show_in_the_gauges() -> None:
    from webhook.core.domain.decision import Decision
    from webhook.core.domain.model import Allocation, TopologyClass

    source = StaticSource(cluster())
    allocation = Allocation(
        node="n1",
        gpus=(2,),
        gpu_count=1,
        memory_mib=81559,
        cores=100,
        vendor="nvidia",
        model="H100",
        topology=TopologyClass.SINGLE,
        loss=0.0,
        policy="binpack",
    )
    source.commit("p", "team-a", lambda _s: Decision(allowed=True, allocation=allocation), False)
    metrics = AdmissionMetrics(source)
    assert samples(metrics, "gpu_admission_gpus_allocated")[(("model", "H100"),)] == 3.0
    assert (
        samples(metrics, "gpu_admission_quota_used")[(("namespace", "team-a"), ("resource", "requests.nvidia.com/gpu"))]
        == 3.0
    )


def test_certificate_expiry_follows_the_file(tmp_path: Path) -> None:
    paths = certs.issue_certificates(tmp_path, "s", "n", days=10)
    metrics = AdmissionMetrics(StaticSource(Snapshot()), cert_file=str(paths.cert))
    (value,) = samples(metrics, "gpu_admission_certificate_expiry_seconds").values()
    assert 10 * 86400 - 120 < value <= 10 * 86400
    certs.issue_certificates(tmp_path, "s", "n", days=3, renew=True)
    (value,) = samples(metrics, "gpu_admission_certificate_expiry_seconds").values()
    assert 3 * 86400 - 120 < value <= 3 * 86400


def test_certificate_expiry_of_a_missing_or_broken_file(tmp_path: Path) -> None:
    fixed = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    assert CertificateExpiry(str(tmp_path / "none.crt"), now=lambda: fixed).seconds_left() is None
    (tmp_path / "bad.crt").write_text("not a certificate")
    assert CertificateExpiry(str(tmp_path / "bad.crt"), now=lambda: fixed).seconds_left() is None


class ReadinessOnly:
    """A source with nothing but `ready()` to say whether it is stale."""

    def __init__(self, ready: tuple[bool, str]) -> None:
        self._ready = ready

    def snapshot(self) -> Snapshot:
        return Snapshot()

    def ready(self) -> tuple[bool, str]:
        return self._ready

    def age_seconds(self) -> float:
        return 0.0

    def commit(self, uid: str, namespace: str, decide: Any, dry_run: bool) -> Any:
        raise AssertionError("not called")


@pytest.mark.parametrize(
    ("ready", "stale"),
    [
        ((True, "static snapshot"), 0.0),
        ((False, "watch cache not synced yet (waiting for: pods)"), 0.0),
        ((False, "watch cache stale: no word from the API server for 91s"), 1.0),
    ],
)
def test_cache_stale_follows_what_the_source_says(ready: tuple[bool, str], stale: float) -> None:
    metrics = AdmissionMetrics(ReadinessOnly(ready))
    assert samples(metrics, "gpu_admission_cache_stale") == {(): stale}


def test_cache_stale_of_the_live_watch_cache() -> None:
    from webhook.cluster.cache import KINDS, ClusterCache
    from webhook.cluster.source import LiveSource

    now = [0.0]
    cache = ClusterCache(clock=lambda: now[0])
    metrics = AdmissionMetrics(LiveSource(cache))
    assert samples(metrics, "gpu_admission_cache_stale") == {(): 0.0}  # still listing: not ready, not stale
    for kind in KINDS:  # what a reflector does after its list
        cache.replace(kind, [])
        cache.heard(kind)
    assert samples(metrics, "gpu_admission_cache_stale") == {(): 0.0}
    now[0] = 91.0  # silent longer than the default stale.afterSeconds (90)
    assert samples(metrics, "gpu_admission_cache_stale") == {(): 1.0}
    assert samples(metrics, "gpu_admission_snapshot_age_seconds") == {(): 91.0}
    cache.heard("pods")
    assert samples(metrics, "gpu_admission_cache_stale") == {(): 1.0}  # the other watches are still silent
    for kind in KINDS:
        cache.heard(kind)
    assert samples(metrics, "gpu_admission_cache_stale") == {(): 0.0}


def test_an_in_process_source_exports_no_reservation_conflicts() -> None:
    metrics = AdmissionMetrics(StaticSource(Snapshot()))
    assert samples(metrics, "gpu_admission_reservation_conflicts_total") == {}


def test_connections_cut_off_come_from_the_tls_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = AdmissionMetrics(StaticSource(Snapshot()))
    monkeypatch.setattr(tls._OVERDUE, "cut", 7)
    assert samples(metrics, "gpu_admission_connections_cut_off_total") == {(): 7.0}
