"""Multi-pod groups through the server: the validating webhook records a group pod's domain with its
reservation, refuses a pod whose domain another group's pods still need (403 group-domain-taken), records
nothing on a dry run, and /metrics counts groups placed whole, split and waiting."""

from __future__ import annotations

from group_support import app_over, cliques_cache, placed, post, ref, worker_review
from server_support import samples

from webhook.cluster.source import LiveSource
from webhook.server.app import EXTENSION
from webhook.server.source import StaticSource


def test_the_validating_webhook_records_groups_refuses_the_second_and_counts_them() -> None:
    source = LiveSource(cliques_cache({"a": 2, "b": 1}))  # a: 8 GPUs, b: 4 GPUs
    app = app_over(source, {"first": "a", "second": "a", "third": "b", "loose": ""})
    client = app.test_client()
    assert post(client, worker_review("first", 0))["allowed"]
    refused = post(client, worker_review("second", 0))
    assert refused["allowed"] is False
    assert refused["status"]["code"] == 403 and refused["status"]["reason"] == "group-domain-taken"
    assert "team-a/pytorchjob/first" not in refused["status"]["message"]  # it speaks of the pod's own group
    assert "team-a/pytorchjob/second needs 8 GPUs" in refused["status"]["message"]
    assert "creates it again" in refused["status"]["message"]
    assert post(client, worker_review("second", 0))["allowed"] is False  # retried: still waiting, counted once
    assert post(client, worker_review("first", 1))["allowed"]
    # A group whose domain is too small for it now is admitted there to wait (nothing else promised).
    assert post(client, worker_review("third", 0))["allowed"]
    assert post(client, worker_review("loose", 0))["allowed"]  # no domain: split
    assert post(client, worker_review("loose", 1))["allowed"]
    groups = source.snapshot().groups
    assert sorted(groups) == ["team-a/pytorchjob/first", "team-a/pytorchjob/third"]
    assert groups["team-a/pytorchjob/first"].members == ("first-0", "first-1")
    metrics = app.extensions[EXTENSION].metrics
    assert samples(metrics, "gpu_admission_groups_total") == {
        (("outcome", "split"),): 1.0, (("outcome", "waiting"),): 2.0, (("outcome", "whole"),): 1.0}
    denied = samples(metrics, "gpu_admission_decisions_total")[
        (("endpoint", "validate"), ("reason", "group-domain-taken"), ("verdict", "denied"))]
    assert denied == 2.0


def test_a_dry_run_records_no_group_and_counts_nothing() -> None:
    source = LiveSource(cliques_cache({"a": 2}))
    app = app_over(source, {"first": "a"})
    answer = post(app.test_client(), worker_review("first", 0, dry_run=True))
    assert answer["allowed"] is True
    assert source.snapshot().groups == {} and source.ledger.active() == ()
    assert samples(app.extensions[EXTENSION].metrics, "gpu_admission_groups_total") == {
        (("outcome", "split"),): 0.0, (("outcome", "waiting"),): 0.0, (("outcome", "whole"),): 0.0}


def test_the_static_source_keeps_group_records_too() -> None:
    source = StaticSource(cliques_cache({"a": 2}).snapshot())
    first, second = ref("first"), ref("second")
    assert source.commit("first-0", "team-a", placed(first, "a", "a-n0"), False, group=first).allowed
    refused = source.commit("second-0", "team-a", placed(second, "a", "a-n1"), False, group=second)
    assert (refused.allowed, refused.code, refused.reason) == (False, 403, "group-domain-taken")
    assert list(source.snapshot().groups) == ["team-a/pytorchjob/first"]
    assert source.group_outcomes() == {"whole": 1, "split": 0, "waiting": 1}
    assert "second-0" not in source.reservations()


def test_groups_another_scheduler_places_or_with_groups_off_are_not_recorded_or_counted() -> None:
    source = LiveSource(cliques_cache({"a": 2}))
    app = app_over(source, {"kai": "", "off": ""})
    client = app.test_client()
    kai = worker_review("kai", 0)
    kai["request"]["object"]["spec"]["schedulerName"] = "kai-scheduler"  # KAI places the group
    off = worker_review("off", 0)
    off["request"]["object"]["metadata"]["annotations"]["gpu-admission.io/group-topology"] = "none"
    assert post(client, kai)["allowed"] and post(client, off)["allowed"]
    assert source.snapshot().groups == {}
    assert set(samples(app.extensions[EXTENSION].metrics, "gpu_admission_groups_total").values()) == {0.0}


def test_a_group_on_a_cluster_without_domains_is_not_counted_split() -> None:
    from ledger_support import cluster_cache  # two nodes, no topology labels

    source = LiveSource(cluster_cache(used=0))
    app = app_over(source, {"plain": ""})
    assert post(app.test_client(), worker_review("plain", 0))["allowed"]
    assert samples(app.extensions[EXTENSION].metrics, "gpu_admission_groups_total")[(("outcome", "split"),)] == 0.0


def test_each_group_is_counted_once_per_outcome_and_memory_stays_bounded() -> None:
    from webhook.tally import GroupOutcomes

    outcomes = GroupOutcomes(memory=2)
    outcomes.placed("ns/a", "clique=c1", room=8, needs=8, first=True)
    outcomes.placed("ns/a", "clique=c1", room=8, needs=8, first=True)  # a retried first pod
    outcomes.placed("ns/a", "clique=c1", room=0, needs=0, first=False)  # a later pod: nothing new
    outcomes.placed("ns/b", "clique=c1", room=4, needs=8, first=True)  # no room now: it waits there
    outcomes.placed("ns/c", "", room=0, needs=0, first=False)
    assert outcomes.counts == {"whole": 1, "split": 1, "waiting": 1}
    assert len(outcomes._seen) == 2  # the oldest key forgotten
