"""Group records in the ledger: one winner when groups race for a domain, across replicas sharing one
ConfigMap; records survive a restart, expire when their pods are gone, and a dry run records nothing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from group_support import CLIQUE, clique_node, cliques_cache, placed, pod, ref
from ledger_support import FakeConfigMaps, race

from webhook.cluster.cache import ClusterCache
from webhook.cluster.group_ledger import (
    CONFIG_MAP,
    REFUSAL_REASON,
    GroupApiStore,
    GroupLedger,
    StoredGroup,
    domain_free,
)
from webhook.cluster.reservations import ApiStore, Ledger
from webhook.cluster.source import LiveSource
from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Snapshot
from webhook.core.placement.groups import GroupRecord, GroupRef


def replicas(api: FakeConfigMaps, cache: Callable[[], ClusterCache], count: int = 2,
             clock: Callable[[], float] = time.time) -> list[LiveSource]:
    return [
        LiveSource(cache(), Ledger(ApiStore(api, "gpu-admission"), clock=clock), keep_seconds=210.0,
                   groups=GroupLedger(GroupApiStore(api, "gpu-admission"), grace_seconds=60.0, clock=clock))
        for _ in range(count)
    ]


def stored_groups(api: FakeConfigMaps) -> dict[str, dict[str, Any]]:
    _, data = api.objects[("gpu-admission", CONFIG_MAP)]
    return {f"{e['record']['namespace']}/{e['record']['name']}": e for e in json.loads(data["groups"])}


def test_two_groups_racing_for_the_last_domain_one_wins_the_other_is_refused_and_later_waits() -> None:
    api = FakeConfigMaps(conflict_rate=0.3, seed=5)
    # Clique "a" has 8 GPUs free: room for one 2 x 4-GPU group, not two. Each replica has mutated
    # its group's first pod into it before either committed.
    one, two = replicas(api, lambda: cliques_cache({"a": 2}))
    first, second = ref("first"), ref("second", namespace="team-b")
    barrier = threading.Barrier(2)
    results: dict[str, Decision] = {}

    def admit(source: LiveSource, group: GroupRef, name: str) -> None:
        barrier.wait()
        results[name] = source.commit(f"{name}-0", group.namespace, placed(group, "a", "a-n0"), False, group=group)

    threads = [threading.Thread(target=admit, args=args)
               for args in ((one, first, "first"), (two, second, "second"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    verdicts = sorted((d.allowed, d.reason) for d in results.values())
    assert verdicts == [(False, REFUSAL_REASON), (True, "allowed")]
    loser = next(name for name, d in results.items() if not d.allowed)
    winner = "first" if loser == "second" else "second"
    denied = results[loser]
    assert denied.code == 403 and "creates it again" in denied.message and "needs 8 GPUs" in denied.message
    # Never both half in: only the winner has a record, and the loser's pod reserved nothing.
    assert set(stored_groups(api)) == {f"team-{'a' if winner == 'first' else 'b'}/pytorchjob/{winner}"}
    assert all(not e.uid.startswith(loser) for r in (one, two) for e in r.ledger.store.known())
    # The loser, created again by its controller, is refused again while the winner's promise stands,
    # on either replica (each reads the shared record).
    winner_source, winner_ref = (one, first) if winner == "first" else (two, second)
    loser_ref = second if loser == "second" else first
    for source in (one, two):
        again = source.commit(f"{loser}-0b", loser_ref.namespace, placed(loser_ref, "a", "a-n1"), False,
                              group=loser_ref)
        assert (again.allowed, again.reason) == (False, REFUSAL_REASON)
    assert winner_source.commit(f"{winner}-1", winner_ref.namespace, placed(winner_ref, "a", "a-n1"), False,
                                group=winner_ref).allowed
    record = stored_groups(api)[winner_ref.key]["record"]
    assert record["members"] == [f"{winner}-0", f"{winner}-1"] and record["domain"] == "a"
    # Once the winner is whole nothing is promised: the loser may take the domain and wait there for
    # room (its pods stay pending); it is never half in while the winner still expects pods.
    assert domain_free(winner_source.snapshot(), f"{CLIQUE}=a") == 0
    later = one.commit(f"{loser}-0c", loser_ref.namespace, placed(loser_ref, "a", "a-n1"), False, group=loser_ref)
    assert later.allowed and stored_groups(api)[loser_ref.key]["record"]["members"] == [f"{loser}-0c"]


def test_many_groups_on_two_replicas_never_promise_more_than_a_domain_holds() -> None:
    api = FakeConfigMaps(conflict_rate=0.4, seed=9)
    sources = replicas(api, lambda: cliques_cache({"a": 4}))  # 16 GPUs: four 2 x 2-GPU groups fit
    groups = [ref(f"job{i}", size=2) for i in range(10)]

    def admit(i: int) -> Decision:
        group = groups[i]
        return sources[i % 2].commit(f"job{i}-0", "team-a", placed(group, "a", f"a-n{i % 4}", gpus=2), False,
                                     group=group)

    admitted = race(admit, threads=10)
    # Each first pod promises its group's second: 4 GPUs per group, 16 in the clique.
    assert len(admitted) == 4
    assert sorted(stored_groups(api)) == sorted(groups[i].key for i in admitted)
    assert sum(s.groups.conflicts for s in sources) > 0  # the shared ConfigMap really was contended


def test_records_survive_a_restart() -> None:
    api = FakeConfigMaps(conflict_rate=0.0)
    (before,) = replicas(api, lambda: cliques_cache({"a": 2, "b": 2}), count=1)
    group = ref("train")
    assert before.commit("train-0", "team-a", placed(group, "b", "b-n0"), False, group=group).allowed
    (after,) = replicas(api, lambda: cliques_cache({"a": 2, "b": 2}), count=1)  # a new process, same store
    record = after.snapshot().groups[group.key]
    assert (record.level, record.domain, record.members, record.size) == (CLIQUE, "b", ("train-0",), 2)
    # ... and what the new process commits builds on it.
    assert after.commit("train-1", "team-a", placed(group, "b", "b-n1"), False, group=group).allowed
    assert stored_groups(api)[group.key]["record"]["members"] == ["train-0", "train-1"]


def test_a_pod_placed_outside_its_groups_domain_is_refused() -> None:
    source = LiveSource(cliques_cache({"a": 2, "b": 2}))
    group = ref("train")
    assert source.commit("train-0", "team-a", placed(group, "a", "a-n0"), False, group=group).allowed
    stray = source.commit("train-1", "team-a", placed(group, "b", "b-n0"), False, group=group)
    assert (stray.allowed, stray.code, stray.reason) == (False, 403, REFUSAL_REASON)
    assert "lives in nvidia.com/gpu.clique=a" in stray.message
    assert [e.uid for e in source.ledger.active()] == ["train-0"]


def test_dry_run_decides_the_same_and_records_nothing() -> None:
    api = FakeConfigMaps(conflict_rate=0.0)
    (source,) = replicas(api, lambda: cliques_cache({"a": 2}), count=1)
    group = ref("train")
    decision = source.commit("train-0", "team-a", placed(group, "a", "a-n0"), True, group=group)
    assert decision.allowed and decision.allocation is not None and decision.allocation.domain == f"{CLIQUE}=a"
    assert api.writes == 0 and source.snapshot().groups == {}
    assert source.groups.records() == {}


def test_a_refused_reservation_takes_its_pod_out_of_the_group_again() -> None:
    source = LiveSource(cliques_cache({"a": 2}))
    group = ref("train")
    calls = []

    def flaky(snapshot: Snapshot) -> Decision:
        calls.append(1)
        return placed(group, "a", "a-n0")(snapshot)

    class Failing:  # the reservation store fails after the group record was written
        conflicts = 0
        version = 0

        def transact(self, namespace: str, change: Any) -> Any:
            change(())
            from webhook.cluster.reservations import ReservationStoreError

            raise ReservationStoreError("HTTP 500")

        def known(self) -> tuple[()]:
            return ()

    source.ledger.store = Failing()  # type: ignore[assignment]
    decision = source.commit("train-0", "team-a", flaky, False, group=group)
    assert (decision.allowed, decision.code, decision.reason) == (False, 503, "reservation-failed")
    assert calls and source.groups.records() == {}


def test_a_record_expires_when_its_pods_are_gone_after_the_grace() -> None:
    now = [1000.0]
    members = [pod("train-0", "a-n0", uid="train-0"), pod("train-1", "a-n1", uid="train-1")]
    cache = cliques_cache({"a": 2}, clock=lambda: now[0])
    source = LiveSource(cache, Ledger(clock=lambda: now[0]),
                        groups=GroupLedger(grace_seconds=60.0, clock=lambda: now[0]))
    group = ref("train")
    for i in range(2):
        assert source.commit(f"train-{i}", "team-a", placed(group, "a", f"a-n{i}"), False, group=group).allowed
        cache.apply("pods", "ADDED", members[i])  # the controller creates the admitted pod
    source.prune()
    assert source.snapshot().groups[group.key].members == ("train-0", "train-1")
    # One worker deleted: it leaves the record, so the group expects its replacement; the domain stays.
    cache.apply("pods", "DELETED", members[0])
    cache.heard("pods")
    source.prune()
    assert source.snapshot().groups[group.key].members == ("train-1",)
    assert source.snapshot().groups[group.key].promised_gpus == 4
    # The other finishes (a finished pod holds nothing): no member lives; the record waits out its grace.
    cache.apply("pods", "MODIFIED", {**members[1], "status": {"phase": "Succeeded"}})
    now[0] += 30.0
    cache.heard("pods")
    source.prune()  # the grace starts with the first prune that finds no member
    now[0] += 59.0
    cache.heard("pods")
    source.prune()
    assert group.key in source.snapshot().groups
    now[0] += 1.0
    cache.heard("pods")
    source.prune()
    assert group.key not in source.snapshot().groups


def test_a_member_that_comes_back_within_the_grace_keeps_the_domain() -> None:
    now = [0.0]
    ledger = GroupLedger(grace_seconds=60.0, clock=lambda: now[0])
    record = GroupRecord("team-a", "pytorchjob/t", CLIQUE, "a", 2, 4, ("p0",))
    ledger.store.transact("groups", lambda entries: ((StoredGroup(record),), None))
    alive = {"p0": False}
    ledger.prune(lambda uid: alive[uid])
    now[0] = 50.0
    alive["p0"] = True  # its reservation, or the watch, shows it again
    ledger.prune(lambda uid: alive[uid])
    alive["p0"] = False
    now[0] = 100.0
    assert ledger.prune(lambda uid: alive[uid]) == 0  # the grace started again at 100
    now[0] = 161.0
    assert ledger.prune(lambda uid: alive[uid]) == 1 and ledger.records() == {}


def test_a_member_whose_reservation_lapsed_unseen_does_not_keep_the_record() -> None:
    now = [0.0]
    cache = cliques_cache({"a": 2}, clock=lambda: now[0])
    source = LiveSource(cache, Ledger(ttl_seconds=30.0, clock=lambda: now[0]),
                        groups=GroupLedger(grace_seconds=60.0, clock=lambda: now[0]))
    group = ref("train")
    assert source.commit("never-created", "team-a", placed(group, "a", "a-n0"), False, group=group).allowed
    for step in (10.0, 40.0, 80.0, 101.0):  # the pod never appears (another webhook refused it)
        now[0] = step
        cache.heard("pods")
        source.prune()
        # counted while its reservation does (TTL 30 s), then 60 s of grace from the first prune after
        assert (group.key in source.groups.records()) == (step < 100.0), step


def test_domain_free_counts_reservations_and_skips_cordoned_nodes() -> None:
    cache = cliques_cache({"a": 2, "b": 1}, pods=[pod("busy", "a-n0", gpus=3)])
    snapshot = cache.snapshot()
    assert (domain_free(snapshot, f"{CLIQUE}=a"), domain_free(snapshot, f"{CLIQUE}=b")) == (5, 4)
    cordoned = clique_node("b-n0", "b")
    cordoned["spec"] = {"unschedulable": True}
    cache.apply("nodes", "MODIFIED", cordoned)
    assert domain_free(cache.snapshot(), f"{CLIQUE}=b") == 0


def test_an_unreadable_group_configmap_is_treated_as_empty() -> None:
    api = FakeConfigMaps(conflict_rate=0.0)
    api.objects[("gpu-admission", CONFIG_MAP)] = (1, {"groups": '[{"record": {"name": 3}}]'})
    ledger = GroupLedger(GroupApiStore(api, "gpu-admission"))
    ledger.refresh()
    assert ledger.records() == {}


def test_the_real_core_two_replicas_two_jobs_one_clique_left() -> None:
    """Mutation and validation by the allocation core itself: both jobs' first pods are mutated into the
    only clique with room before either is validated; the ledger admits one, refuses the other."""
    import jsonpatch

    from webhook.core.admission import admit
    from webhook.core.placement.groups import group_of
    from webhook.core.policy.model import Policy

    api = FakeConfigMaps(conflict_rate=0.0)
    # Clique a: 2 nodes x 4 GPUs free; clique b: 1 node, too small for a 2 x 4-GPU job.
    one, two = replicas(api, lambda: cliques_cache({"a": 2, "b": 1}))
    policy = Policy()

    def worker(job: str, index: int, namespace: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{job}-{index}", "namespace": namespace, "uid": f"{job}-{index}",
                             "labels": {"training.kubeflow.org/job-name": job,
                                        "training.kubeflow.org/operator-name": "pytorchjob-controller"},
                             "annotations": {"gpu-admission.io/group-size": "2",
                                             "gpu-admission.io/group-topology": "required"}},
                "spec": {"containers": [{"name": "main", "image": "train",
                                         "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}

    def mutated(source: LiveSource, pod: dict[str, Any]) -> dict[str, Any]:
        decision = admit.mutate(pod, source.snapshot(), policy, namespace=pod["metadata"]["namespace"])
        assert decision.allowed and decision.allocation is not None, decision.message
        return jsonpatch.apply_patch(pod, [dict(op) for op in decision.patch])

    def validated(source: LiveSource, pod: dict[str, Any]) -> Decision:
        namespace = pod["metadata"]["namespace"]
        return source.commit(pod["metadata"]["uid"], namespace,
                             lambda snapshot: admit.validate(pod, snapshot, policy, namespace=namespace), False,
                             group=group_of(pod, namespace))

    first, second = mutated(one, worker("first", 0, "team-a")), mutated(two, worker("second", 0, "team-b"))
    for pod in (first, second):  # noqa: F402 - both chose clique a, as a sealed requirement
        assert json.loads(pod["metadata"]["annotations"]["gpu-admission.io/allocation"])["domain"] == f"{CLIQUE}=a"
    assert validated(one, first).allowed
    refused = validated(two, second)
    assert (refused.allowed, refused.code, refused.reason) == (False, 403, REFUSAL_REASON)
    assert set(stored_groups(api)) == {"team-a/pytorchjob/first"}
    # The winner's second pod follows its record, on the other replica too.
    follower = mutated(two, worker("first", 1, "team-a"))
    assert json.loads(follower["metadata"]["annotations"]["gpu-admission.io/allocation"])["domain"] == f"{CLIQUE}=a"
    assert validated(two, follower).allowed
    assert stored_groups(api)["team-a/pytorchjob/first"]["record"]["members"] == ["first-0", "first-1"]
