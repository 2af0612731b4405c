"""StaticSource: decisions see earlier reservations, racing commits never overshoot, dry runs record nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable

from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Allocation, QuotaLimits, Snapshot, TopologyClass, Usage
from webhook.server.source import SnapshotSource, StaticSource


def allocation(gpus: int = 1) -> Allocation:
    return Allocation(
        node=None,
        gpus=(),
        gpu_count=gpus,
        memory_mib=1000,
        cores=100,
        vendor="nvidia",
        model="M",
        topology=TopologyClass.SINGLE,
        loss=0.0,
        policy="binpack",
    )


def quota_decider(namespace: str, limit: int, asked: int = 1) -> Callable[[Snapshot], Decision]:
    """A stand-in for admit.validate: allowed while the namespace's GPU usage leaves room."""

    def decide(snapshot: Snapshot) -> Decision:
        used = snapshot.namespace_usage.get(namespace, Usage()).gpus
        if used + asked > limit:
            return Decision(allowed=False, code=403, reason="quota-exceeded", message=f"used {used}")
        return Decision(allowed=True, allocation=allocation(asked))

    return decide


def snapshot_with_quota(limit: int) -> Snapshot:
    return Snapshot(quotas={"team-a": (QuotaLimits("q", gpus=limit),)})


def test_static_source_satisfies_the_protocol() -> None:
    assert isinstance(StaticSource(Snapshot()), SnapshotSource)


def test_commit_counts_earlier_reservations() -> None:
    source = StaticSource(snapshot_with_quota(2))
    decide = quota_decider("team-a", 2)
    assert [source.commit(f"p{i}", "team-a", decide, False).allowed for i in range(3)] == [True, True, False]
    assert source.snapshot().namespace_usage["team-a"] == Usage(2, 2000, 200)
    assert sorted(source.reservations()) == ["p0", "p1"]


def test_dry_run_decides_the_same_and_records_nothing() -> None:
    source = StaticSource(snapshot_with_quota(1))
    decide = quota_decider("team-a", 1)
    assert source.commit("p1", "team-a", decide, True).allowed
    assert source.commit("p1", "team-a", decide, True).allowed
    assert source.reservations() == {}
    assert source.snapshot() is source.snapshot()
    assert "team-a" not in source.snapshot().namespace_usage


def test_denials_and_allocation_free_decisions_record_nothing() -> None:
    source = StaticSource(Snapshot())
    source.commit("p1", "team-a", lambda _s: Decision(allowed=False, code=403), False)
    source.commit("p2", "team-a", lambda _s: Decision(allowed=True), False)
    assert source.reservations() == {}


def test_the_same_pod_seen_again_is_not_counted_twice() -> None:
    source = StaticSource(snapshot_with_quota(1))
    decide = quota_decider("team-a", 1)
    assert source.commit("p1", "team-a", decide, False).allowed
    assert source.commit("p1", "team-a", decide, False).allowed  # a retried call for the same pod
    assert source.snapshot().namespace_usage["team-a"].gpus == 1
    assert not source.commit("p2", "team-a", decide, False).allowed


def test_racing_commits_take_exactly_the_quota() -> None:
    source = StaticSource(snapshot_with_quota(7))
    decide = quota_decider("team-a", 7)
    results: list[bool] = []
    barrier = threading.Barrier(40)

    def admit(i: int) -> None:
        barrier.wait()
        results.append(source.commit(f"pod-{i}", "team-a", decide, False).allowed)

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert results.count(True) == 7 and results.count(False) == 33
    assert source.snapshot().namespace_usage["team-a"].gpus == 7


def test_readiness_and_age() -> None:
    now = [100.0]
    source = StaticSource(Snapshot(), description="cluster files c.yaml", clock=lambda: now[0])
    now[0] = 112.5
    assert source.age_seconds() == 12.5
    assert source.ready() == (True, "cluster files c.yaml: 0 nodes, 0 reservations")
