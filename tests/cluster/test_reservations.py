"""Reservations: decide-then-record is atomic in one process and across replicas sharing a ConfigMap."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes.client import V1ConfigMap
from kubernetes.client.exceptions import ApiException
from ledger_support import H100, FakeConfigMaps, cluster_cache, race, running

from webhook.cluster.cache import KINDS, ClusterCache
from webhook.cluster.reservations import ApiStore, InProcessStore, Ledger, Reservation
from webhook.cluster.source import LiveSource, with_reservations
from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Allocation, GpuUsage, NodeUsage, Snapshot, TopologyClass, Usage
from webhook.core.placement.state import with_allocation
from webhook.core.policy.model import Policy


def allocation(gpus: int = 1, node_name: str | None = None, indices: tuple[int, ...] = ()) -> Allocation:
    return Allocation(node_name, indices, gpus, 81559, 100, "nvidia", H100, TopologyClass.SINGLE, 0.0, "binpack")


def quota_decider(gpus: int = 1, namespace: str = "team-a") -> Callable[[Snapshot], Decision]:
    """A stand-in for admit.validate: the namespace's GPU quota, nothing else. It takes a millisecond,
    as validation does, so that racing threads really overlap."""

    def decide(snapshot: Snapshot) -> Decision:
        used = snapshot.namespace_usage.get(namespace, Usage()).gpus
        time.sleep(0.001)
        limits = [q.gpus for q in snapshot.quotas.get(namespace, ()) if q.gpus is not None]
        if limits and used + gpus > min(limits):
            return Decision(
                False, 403, f"quota exceeded: used {used}, asked {gpus}, limit {min(limits)}", reason="quota"
            )
        return Decision(True, allocation=allocation(gpus))

    return decide




def test_fifty_threads_take_exactly_the_last_gpus_of_a_quota() -> None:
    source = LiveSource(cluster_cache(used=6))
    admitted = race(lambda i: source.commit(f"pod-{i}", "team-a", quota_decider(), dry_run=False))
    assert len(admitted) == 2
    assert sorted(e.uid for e in source.ledger.active()) == sorted(f"pod-{i}" for i in admitted)
    assert source.snapshot().namespace_usage["team-a"] == Usage(8, 8 * 81559, 800)
    denied = source.commit("pod-late", "team-a", quota_decider(), dry_run=False)
    assert (denied.allowed, denied.code, denied.message) == (False, 403, "quota exceeded: used 8, asked 1, limit 8")




def test_two_replicas_sharing_a_configmap_never_overcommit_and_lose_nothing() -> None:
    api = FakeConfigMaps()
    replicas = [
        LiveSource(cluster_cache(used=3), Ledger(ApiStore(api, "gpu-admission")), keep_seconds=210.0) for _ in range(2)
    ]
    admitted = race(lambda i: replicas[i % 2].commit(f"pod-{i}", "team-a", quota_decider(), dry_run=False))
    assert len(admitted) == 5
    assert api.uids() == sorted(f"pod-{i}" for i in admitted)
    assert api.injected > 0
    conflicts = sum(r.ledger.store.conflicts for r in replicas)
    assert conflicts >= api.injected
    # Each replica, once it has read the shared object, counts every reservation: no room left anywhere.
    for replica in replicas:
        late = replica.commit("pod-late", "team-a", quota_decider(), dry_run=False)
        assert (late.allowed, late.message) == (False, "quota exceeded: used 8, asked 1, limit 8")


def test_lost_writes_are_counted_in_the_metrics() -> None:
    from server_support import samples

    from webhook.server.metrics import AdmissionMetrics

    api = FakeConfigMaps(conflict_rate=0.5, seed=11)
    replicas = [LiveSource(cluster_cache(used=0, quota=40), Ledger(ApiStore(api, "gpu-admission"))) for _ in range(2)]
    race(lambda i: replicas[i % 2].commit(f"pod-{i}", "team-a", quota_decider(), dry_run=False))
    exported = []
    for replica in replicas:
        (value,) = samples(AdmissionMetrics(replica), "gpu_admission_reservation_conflicts_total").values()
        assert value == replica.ledger.store.conflicts
        exported.append(value)
    assert sum(exported) >= api.injected > 0


def test_two_replicas_taking_two_gpus_each_stop_at_the_quota() -> None:
    api = FakeConfigMaps(conflict_rate=0.5, seed=3)
    replicas = [LiveSource(cluster_cache(used=0, quota=9), Ledger(ApiStore(api, "gpu-admission"))) for _ in range(2)]
    admitted = race(
        lambda i: replicas[i % 2].commit(f"pod-{i}", "team-a", quota_decider(gpus=2), dry_run=False), threads=20
    )
    assert len(admitted) == 4  # 4 x 2 = 8 <= 9 < 10
    assert api.uids() == sorted(f"pod-{i}" for i in admitted)


def test_a_reservation_expires_after_its_ttl_when_the_pod_never_appears() -> None:
    now = [1000.0]
    cache = cluster_cache(used=7, clock=lambda: now[0])
    source = LiveSource(cache, Ledger(ttl_seconds=120.0, clock=lambda: now[0]))
    assert source.commit("pod-a", "team-a", quota_decider(), dry_run=False).allowed
    assert source.snapshot().namespace_usage["team-a"].gpus == 8
    now[0] = 1119.0
    for kind in ("nodes", "gpuinventories", "namespaces", "resourcequotas", "pods"):
        cache.heard(kind)
    assert not source.commit("pod-b", "team-a", quota_decider(), dry_run=False).allowed
    now[0] = 1120.0
    # The pod watch last heard from the server at 1119: pod-a might still be on its way.
    assert source.snapshot().namespace_usage["team-a"].gpus == 8
    cache.heard("pods")  # now it has heard at 1120: pod-a was refused elsewhere and never created
    assert source.snapshot().namespace_usage["team-a"].gpus == 7
    assert source.commit("pod-b", "team-a", quota_decider(), dry_run=False).allowed
    assert [e.uid for e in source.ledger.active()] == ["pod-b"]
    assert [(e.uid, e.expires_at) for e in source.ledger.store.known()] == [("pod-b", 1240.0)]


def test_dry_run_decides_the_same_and_records_nothing() -> None:
    api = FakeConfigMaps(conflict_rate=0.0)
    for store in (InProcessStore(), ApiStore(api, "gpu-admission")):
        source = LiveSource(cluster_cache(used=7), Ledger(store))
        before = source.snapshot()
        first = source.commit("pod-a", "team-a", quota_decider(), dry_run=True)
        second = source.commit("pod-b", "team-a", quota_decider(), dry_run=True)
        assert first.allowed and second.allowed  # neither counted the other
        assert store.known() == ()
        assert source.snapshot() is before
    assert api.writes == 0


def test_the_watch_seeing_the_pod_ends_its_reservation_without_double_counting() -> None:
    cache = cluster_cache(used=6)
    source = LiveSource(cache)
    assert source.commit("uid-new-0", "team-a", quota_decider(2), dry_run=False).allowed
    assert source.snapshot().namespace_usage["team-a"].gpus == 8
    cache.apply("pods", "ADDED", running("new-0", 2, node_name=None))
    assert source.snapshot().namespace_usage["team-a"].gpus == 8  # counted once, by the watch
    assert source.droppable(source.ledger.store.known()[0])
    assert source.prune() == 1 and source.ledger.store.known() == ()
    cache.apply("pods", "DELETED", running("new-0", 2, node_name=None))
    assert source.snapshot().namespace_usage["team-a"].gpus == 6
    assert source.commit("uid-new-1", "team-a", quota_decider(2), dry_run=False).allowed


def test_a_retried_admission_of_the_same_pod_is_not_counted_twice() -> None:
    source = LiveSource(cluster_cache(used=7))
    assert source.commit("pod-a", "team-a", quota_decider(), dry_run=False).allowed
    assert source.commit("pod-a", "team-a", quota_decider(), dry_run=False).allowed
    assert [e.uid for e in source.ledger.active()] == ["pod-a"]
    assert source.snapshot().namespace_usage["team-a"].gpus == 8


def test_with_reservations_equals_folding_with_allocation() -> None:
    base = cluster_cache(used=2).snapshot()
    entries = [
        Reservation("a", "team-a", allocation(2, "n1", (4, 5)), 10.0),
        Reservation("b", "team-b", allocation(1, "n1", (6,)), 10.0),
        Reservation("c", "team-a", allocation(1, None), 10.0),
        Reservation("d", "team-b", allocation(1, "n2", (0,)), 10.0),
    ]
    folded = base
    for e in entries:
        folded = with_allocation(folded, e.namespace, e.allocation)
    assert with_reservations(base, entries) == folded
    assert folded.usage["n1"].gpus[4] == GpuUsage(81559, 100, 1, True)
    assert folded.usage["n2"] == NodeUsage((GpuUsage(81559, 100, 1, True),) + (GpuUsage(),) * 7, 0, 0, 1)
    assert folded.namespace_usage == {"team-a": Usage(5, 5 * 81559, 500), "team-b": Usage(2, 2 * 81559, 200)}


def test_stale_cache_answers_through_the_grace_period_then_follows_on_stale() -> None:
    now = [0.0]
    cache = cluster_cache(used=0, clock=lambda: now[0])
    policies = {"deny": Policy(), "allow": Policy(on_stale="allow")}
    assert Policy().on_stale == "deny"
    for action, policy in policies.items():
        source = LiveSource(cache, policy=lambda policy=policy: policy)
        now[0] = 0.0
        for kind in ("nodes", "gpuinventories", "namespaces", "resourcequotas", "pods"):
            cache.heard(kind)
        assert source.ready() == (True, "watch cache synced: 2 nodes, 0 GPU pods, 0 reservations")
        now[0] = 91.0
        assert source.ready() == (False, "watch cache stale: no word from the API server for 91s")
        assert source.commit(f"{action}-1", "team-a", quota_decider(), dry_run=True).allowed  # within the grace
        now[0] = 211.0
        late = source.commit(f"{action}-2", "team-a", quota_decider(), dry_run=True)
        if action == "deny":
            assert (late.allowed, late.code, late.reason) == (False, 503, "stale")
            assert late.message == (
                "GPU admission cannot check quotas: no word from the API server for 211s (limit 210s); retry later"
            )
        else:
            assert late.allowed
        assert source.age_seconds() == 211.0


def test_an_unsynced_cache_is_not_ready_and_refuses() -> None:
    cache = ClusterCache(clock=lambda: 0.0)
    cache.replace("nodes", [])
    source = LiveSource(cache)
    assert source.ready() == (
        False,
        f"watch cache not synced yet (waiting for: {', '.join(k for k in KINDS if k != 'nodes')})",
    )
    decision = source.commit("pod-a", "team-a", quota_decider(), dry_run=False)
    assert (decision.allowed, decision.code, decision.reason) == (False, 503, "not-synced")


def test_fifty_mutated_pods_validated_concurrently_fill_the_demo_quota_exactly() -> None:
    import jsonpatch

    from webhook.cluster.files import demo_objects
    from webhook.core.admission.admit import mutate, validate

    cache = ClusterCache(clock=lambda: 0.0)
    objects = demo_objects()
    kinds = {
        "Node": "nodes",
        "GPUInventory": "gpuinventories",
        "Namespace": "namespaces",
        "ResourceQuota": "resourcequotas",
        "Pod": "pods",
    }
    for kind, plural in kinds.items():
        cache.replace(plural, [o for o in objects if o["kind"] == kind])
        cache.heard(plural)
    for plural in set(KINDS) - set(kinds.values()):
        cache.replace(plural, [])  # the demo cluster has none (DRA claims, ...)
        cache.heard(plural)
    assert cache.synced(), cache.unsynced()
    source = LiveSource(cache)
    policy = Policy()
    # team-a: 8 GPUs and 600000 MiB allowed, 5 GPUs and 334236 MiB in use: room for 3 whole H100s.
    assert source.snapshot().namespace_usage["team-a"] == Usage(5, 334236, 430)

    def mutated(i: int) -> dict[str, Any]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"train-{i}", "namespace": "team-a"},
            "spec": {
                "containers": [{"name": "main", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            },
        }
        planned = mutate(pod, source.snapshot(), policy)
        assert planned.allowed, planned.message
        final: dict[str, Any] = jsonpatch.apply_patch(pod, list(planned.patch))
        final["metadata"]["uid"] = f"uid-train-{i}"
        return final

    # Every pod passed the mutating webhook before any was validated: the validations race.
    pods = [mutated(i) for i in range(50)]

    def admit(i: int) -> Decision:
        return source.commit(f"uid-train-{i}", "team-a", lambda snap: validate(pods[i], snap, policy), dry_run=False)

    admitted = race(admit)
    assert len(admitted) == 3
    assert source.snapshot().namespace_usage["team-a"].gpus == 8
    late = source.commit("uid-train-0", "team-a", lambda snap: validate(pods[0], snap, policy), dry_run=True)
    assert late.allowed is (0 in admitted)


def test_an_unreachable_shared_ledger_refuses_with_503() -> None:
    class Down(FakeConfigMaps):
        def read_namespaced_config_map(self, name: str, namespace: str) -> V1ConfigMap:
            raise ApiException(status=500, reason="Internal Server Error")

    source = LiveSource(cluster_cache(used=0), Ledger(ApiStore(Down(), "gpu-admission")))
    decision = source.commit("pod-a", "team-a", quota_decider(), dry_run=False)
    assert (decision.allowed, decision.code, decision.reason) == (False, 503, "reservation-failed")
    assert decision.message == (
        "GPU admission could not record the pod's reservation (cannot read ConfigMap "
        "gpu-admission/gpu-admission-ledger-team-a: HTTP 500 Internal Server Error); retry"
    )


def test_a_silent_pod_watch_keeps_reservations_past_their_ttl() -> None:
    now = [0.0]
    cache = cluster_cache(used=7, clock=lambda: now[0])
    source = LiveSource(cache, Ledger(ttl_seconds=120.0, clock=lambda: now[0]), keep_seconds=0.0)
    assert source.commit("pod-a", "team-a", quota_decider(), dry_run=False).allowed
    now[0] = 150.0  # every watch silent since 0: the pod may exist without the cache knowing
    assert source.snapshot().namespace_usage["team-a"].gpus == 8
    assert source.prune() == 0
    decision = source.commit("pod-b", "team-a", quota_decider(), dry_run=False)
    assert (decision.allowed, decision.message) == (False, "quota exceeded: used 8, asked 1, limit 8")
    cache.heard("pods")
    assert source.snapshot().namespace_usage["team-a"].gpus == 7
    assert source.prune() == 1 and source.ledger.store.known() == ()


def test_the_shared_store_keeps_finished_entries_until_every_replica_can_have_seen_them() -> None:
    now = [0.0]
    api = FakeConfigMaps(conflict_rate=0.0)
    cache = cluster_cache(used=0, clock=lambda: now[0])
    source = LiveSource(cache, Ledger(ApiStore(api, "gpu-admission"), clock=lambda: now[0]), keep_seconds=210.0)
    assert source.commit("uid-new-0", "team-a", quota_decider(2), dry_run=False).allowed
    assert source.commit("uid-gone", "team-a", quota_decider(1), dry_run=False).allowed
    now[0] = 10.0
    cache.apply("pods", "ADDED", running("new-0", 2, node_name=None))
    for kind in ("nodes", "gpuinventories", "namespaces", "resourcequotas", "pods"):
        cache.heard(kind)
    assert source.snapshot().namespace_usage["team-a"].gpus == 3
    assert source.prune() == 0 and api.uids() == ["uid-gone", "uid-new-0"]
    now[0] = 220.0
    cache.heard("pods")
    assert source.prune() == 1 and api.uids() == ["uid-gone"]  # seen 210 s ago
    now[0] = 330.0
    cache.heard("pods")
    assert source.prune() == 1 and api.uids() == []  # expired at 120, plus 210
