"""Multi-pod groups land in one topology domain: the first pod chooses it, later pods follow, the record
and the affinity keep it through re-invocation and validation."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonpatch
import pytest
from builders import H100, node, pod, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.admission import admit
from webhook.core.domain.model import GpuUsage, Node, NodeUsage, Snapshot
from webhook.core.placement.group_place import Choice, Level, choose, rooms, table_of
from webhook.core.placement.groups import GroupRecord
from webhook.core.placement.state import index_of
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import Policy, PolicyError, parse_policy

CLIQUE, RACK = "nvidia.com/gpu.clique", "topology.kubernetes.io/rack"
REQUIRED_KEY = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED_KEY = "preferredDuringSchedulingIgnoredDuringExecution"


def gpu_node(name: str, clique: str | None, rack: str | None = None, gpus: int = 4) -> Node:
    labels = {"nvidia.com/gpu.product": H100[0]}
    if clique:
        labels[CLIQUE] = clique
    if rack:
        labels[RACK] = rack
    return dataclasses.replace(node(name, H100, gpus), labels=labels)


# Three cliques of 4-GPU nodes: c1 12 GPUs, c2 8, c3 20; racks r1 (c1 + c2) and r2 (c3).
NODES = ([gpu_node(f"c1-{i}", "c1", "r1") for i in range(3)] + [gpu_node(f"c2-{i}", "c2", "r1") for i in range(2)]
         + [gpu_node(f"c3-{i}", "c3", "r2") for i in range(5)])
CLUSTER = snapshot(*NODES)
REQUIRED = Policy(group_topology="required")
PREFERRED = Policy()  # the default


def busy(nodes: list[Node], names: set[str]) -> dict[str, NodeUsage]:
    """Every GPU of the named nodes taken."""
    return {n.name: NodeUsage(tuple(GpuUsage(81559, 100, 1, True) for _ in n.gpus)) for n in nodes if n.name in names}


def lws_pod(size: int, gpus: int = 4, group: int = 0, worker: int = 0, **annotations: str) -> dict[str, Any]:
    p = pod({"nvidia.com/gpu": gpus}, name=f"vllm-{group}-{worker}",
            annotations={"leaderworkerset.sigs.k8s.io/size": str(size), **annotations})
    p["metadata"]["labels"] = {"leaderworkerset.sigs.k8s.io/name": "vllm",
                               "leaderworkerset.sigs.k8s.io/group-index": str(group),
                               "leaderworkerset.sigs.k8s.io/worker-index": str(worker)}
    return p


def patched(p: dict[str, Any], snap: Snapshot = CLUSTER, policy: Policy = REQUIRED) -> tuple[Any, dict[str, Any]]:
    decision = admit.mutate(p, snap, policy)
    assert decision.allowed, decision.message
    out = jsonpatch.apply_patch(p, [dict(op) for op in decision.patch])
    out["metadata"]["uid"] = "uid-1"
    return decision, out


def terms(p: dict[str, Any]) -> list[dict[str, Any]]:
    return p["spec"]["affinity"]["nodeAffinity"][REQUIRED_KEY]["nodeSelectorTerms"]


def in_clique(value: str) -> dict[str, Any]:
    return {"key": CLIQUE, "operator": "In", "values": [value]}


def test_first_pod_takes_the_clique_that_holds_the_group_with_least_left_over() -> None:
    decision, out = patched(lws_pod(size=2))  # 8 GPUs: c2 exactly, c1 and c3 would keep more free
    allocation = decision.allocation
    assert (allocation.group, allocation.domain) == ("team-a/lws/vllm/0", "nvidia.com/gpu.clique=c2")
    assert allocation.node in ("c2-0", "c2-1")
    assert all(in_clique("c2") in t["matchExpressions"] for t in terms(out))
    record = json.loads(out["metadata"]["annotations"][ANNOTATION])
    assert record["group"] == "team-a/lws/vllm/0" and record["domain"] == "nvidia.com/gpu.clique=c2"
    assert record["groupRequired"] == in_clique("c2")
    assert admit.validate(out, CLUSTER, REQUIRED).allowed


def test_a_group_the_smaller_cliques_cannot_hold_goes_to_the_one_that_can() -> None:
    decision, _ = patched(lws_pod(size=4))  # 16 GPUs: only c3 (20)
    assert decision.allocation.domain == "nvidia.com/gpu.clique=c3"


def test_preferred_mode_prefers_the_domain_and_requires_nothing_more() -> None:
    decision, out = patched(lws_pod(size=2), policy=PREFERRED)
    assert decision.allocation.domain == "nvidia.com/gpu.clique=c2"
    assert all(in_clique("c2") not in t.get("matchExpressions", []) for t in terms(out))
    prefs = out["spec"]["affinity"]["nodeAffinity"][PREFERRED_KEY]
    assert {"weight": 100, "preference": {"matchExpressions": [in_clique("c2")]}} in prefs
    assert "groupRequired" not in json.loads(out["metadata"]["annotations"][ANNOTATION])


def test_later_pods_follow_the_record_not_the_best_fit() -> None:
    record = GroupRecord("team-a", "lws/vllm/0", CLIQUE, "c1", 2, 4, ("uid-0",))
    snap = dataclasses.replace(CLUSTER, groups={record.key: record})
    decision, out = patched(lws_pod(size=2, worker=1), snap)
    assert decision.allocation.domain == "nvidia.com/gpu.clique=c1"
    assert decision.allocation.node in ("c1-0", "c1-1", "c1-2")
    assert all(in_clique("c1") in t["matchExpressions"] for t in terms(out))


def test_a_later_pod_the_domain_can_never_host_is_refused_with_the_domain() -> None:
    record = GroupRecord("team-a", "lws/vllm/0", CLIQUE, "c2", 2, 4, ("uid-0",))
    snap = dataclasses.replace(CLUSTER, groups={record.key: record})
    big = snapshot(*NODES, gpu_node("big", "c9", "r3", gpus=8))
    snap = dataclasses.replace(big, groups={record.key: record})
    decision = admit.mutate(lws_pod(size=2, gpus=8, worker=1), snap, REQUIRED)
    assert (decision.allowed, decision.code, decision.reason) == (False, 422, "group-domain")
    assert decision.message == ("group team-a/lws/vllm/0 lives in nvidia.com/gpu.clique=c2, where no node can "
                                "ever host this pod (8 GPU(s))")


def test_second_mutate_pass_is_a_no_op() -> None:
    record = GroupRecord("team-a", "lws/vllm/0", CLIQUE, "c1", 2, 4, ("uid-0",))
    later = dataclasses.replace(CLUSTER, groups={record.key: record})
    waiting = snapshot(*NODES, usage=busy(NODES, {"c3-0", "c3-1"}))
    for snap, size in ((CLUSTER, 2), (later, 2), (waiting, 4), (CLUSTER, 8)):
        for policy in (REQUIRED, PREFERRED):
            first = admit.mutate(lws_pod(size=size), snap, policy)
            if not first.allowed:  # a group no domain holds, in required mode
                continue
            _, out = patched(lws_pod(size=size), snap, policy)
            again = admit.mutate(out, snap, policy)
            assert again.allowed and again.patch == (), (size, policy.group_topology)
            assert again.allocation == first.allocation
            assert admit.validate(out, snap, policy).allowed


def test_validate_refuses_a_pod_whose_group_requirement_was_removed() -> None:
    _, out = patched(lws_pod(size=2))
    for term in terms(out):
        term["matchExpressions"] = [e for e in term["matchExpressions"] if e.get("key") != CLIQUE]
    refused = admit.validate(out, CLUSTER, REQUIRED)
    assert (refused.allowed, refused.code, refused.reason) == (False, 403, "affinity-changed")
    assert "nvidia.com/gpu.clique In ['c2']" in refused.message and "team-a/lws/vllm/0" in refused.message
    # the mutating webhook, invoked again after the change, ANDs it back in from the sealed record
    again = admit.mutate(out, CLUSTER, REQUIRED)
    restored = jsonpatch.apply_patch(out, [dict(op) for op in again.patch])
    assert all(in_clique("c2") in t["matchExpressions"] for t in terms(restored))
    assert admit.validate(restored, CLUSTER, REQUIRED).allowed
    # a new term without it is a way around it as well
    _, out = patched(lws_pod(size=2))
    terms(out).append({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]})
    assert admit.validate(out, CLUSTER, REQUIRED).reason == "affinity-changed"


def test_group_larger_than_any_domain_is_refused_with_the_figures() -> None:
    only_cliques = dataclasses.replace(REQUIRED, group_levels=(CLIQUE,))
    decision = admit.mutate(lws_pod(size=8), CLUSTER, only_cliques)  # 32 GPUs; the largest clique has 20
    assert (decision.allowed, decision.code, decision.reason) == (False, 422, "group-too-large")
    assert decision.message == ("group team-a/lws/vllm/0 needs 32 GPUs (8 pods x 4) in one nvidia.com/gpu.clique; "
                                "the largest has 20")
    # with racks as well, the refusal names the outermost level present (no node carries a zone label)
    decision = admit.mutate(lws_pod(size=6), CLUSTER, REQUIRED)  # 24 GPUs: cliques and racks hold 20
    assert decision.message == ("group team-a/lws/vllm/0 needs 24 GPUs (6 pods x 4) in one "
                                "topology.kubernetes.io/rack; the largest has 20")


def test_a_group_no_clique_holds_goes_to_a_rack_that_does() -> None:
    bigger = snapshot(*NODES, gpu_node("x-0", None, "r2"), gpu_node("x-1", None, "r2"))  # r2: 28 GPUs
    decision, out = patched(lws_pod(size=6), bigger)
    assert decision.allocation.domain == "topology.kubernetes.io/rack=r2"
    assert all({"key": RACK, "operator": "In", "values": ["r2"]} in t["matchExpressions"] for t in terms(out))


def test_preferred_mode_splits_a_group_no_domain_holds_with_a_warning() -> None:
    decision, out = patched(lws_pod(size=8), policy=dataclasses.replace(PREFERRED, group_levels=(CLIQUE,)))
    assert decision.allocation.group == "team-a/lws/vllm/0" and decision.allocation.domain == ""
    assert decision.warnings == ("group team-a/lws/vllm/0 needs 32 GPUs (8 pods x 4) in one nvidia.com/gpu.clique; "
                                 "the largest has 20: placed split",)
    assert "groupRequired" not in json.loads(out["metadata"]["annotations"][ANNOTATION])


def test_a_group_that_fits_only_when_capacity_frees_waits_or_is_refused() -> None:
    snap = snapshot(*NODES, usage=busy(NODES, {"c3-0", "c3-1"}))  # c3 has 12 free of 20
    decision, out = patched(lws_pod(size=4), snap)  # 16 GPUs: only c3 could
    assert decision.allocation.domain == "nvidia.com/gpu.clique=c3"
    assert "group team-a/lws/vllm/0 waits for room for 16 GPUs (4 pods x 4) in nvidia.com/gpu.clique=c3" in (
        decision.warnings)
    deny = dataclasses.replace(REQUIRED, when_full="deny")
    refused = admit.mutate(lws_pod(size=4), snap, deny)
    assert (refused.allowed, refused.code, refused.reason) == (False, 403, "cluster-full")
    assert "nvidia.com/gpu.clique=c3 could when capacity frees up" in refused.message
    split = admit.mutate(lws_pod(size=4), snap, PREFERRED)
    assert split.allowed and split.allocation.domain == ""
    assert split.warnings[0] == ("group team-a/lws/vllm/0 placed split: no nvidia.com/gpu.clique has room for 16 GPUs "
                                 "(4 pods x 4) now")


def test_other_groups_promises_keep_a_domain_from_a_new_group() -> None:
    other = GroupRecord("team-b", "train", CLIQUE, "c2", 3, 4, ("b-0",))  # 8 GPUs of c2 still to come
    snap = dataclasses.replace(CLUSTER, groups={other.key: other})
    decision, _ = patched(lws_pod(size=2), snap)
    assert decision.allocation.domain == "nvidia.com/gpu.clique=c1"


def test_an_open_ended_group_takes_the_innermost_domain_with_most_room() -> None:
    p = pod({"nvidia.com/gpu": 4}, name="train-worker-0")
    p["metadata"]["labels"] = {"training.kubeflow.org/job-name": "train",
                               "training.kubeflow.org/replica-type": "worker",
                               "training.kubeflow.org/operator-name": "pytorchjob-controller"}
    decision, _ = patched(p)
    assert (decision.allocation.group, decision.allocation.domain) == ("team-a/pytorchjob/train",
                                                                       "nvidia.com/gpu.clique=c3")


def test_pods_of_another_scheduler_are_recorded_but_get_no_domain_affinity() -> None:
    p = lws_pod(size=2)
    p["spec"]["schedulerName"] = "volcano"
    decision, out = patched(p)
    assert (decision.allocation.group, decision.allocation.domain) == ("team-a/lws/vllm/0", "")
    assert "affinity" not in out["spec"]


def test_clusters_without_topology_labels_admit_groups_as_before() -> None:
    plain = snapshot(*(gpu_node(f"n{i}", None) for i in range(3)))
    decision, out = patched(lws_pod(size=2), plain)
    assert (decision.allocation.group, decision.allocation.domain) == ("team-a/lws/vllm/0", "")
    record = json.loads(out["metadata"]["annotations"][ANNOTATION])
    assert "domain" not in record and "groupRequired" not in record


def test_pods_of_no_group_keep_the_usual_record() -> None:
    decision, out = patched(pod({"nvidia.com/gpu": 4}))
    record = json.loads(out["metadata"]["annotations"][ANNOTATION])
    assert "group" not in record and "domain" not in record and decision.allocation.group == ""


@pytest.mark.parametrize(
    ("annotations", "field"),
    [({"gpu-admission.io/group-topology": "strict"}, "gpu-admission.io/group-topology"),
     ({"gpu-admission.io/group-size": "lots"}, "gpu-admission.io/group-size")],
)
def test_malformed_group_annotations_are_refused_naming_them(annotations: dict[str, str], field: str) -> None:
    decision = admit.mutate(lws_pod(size=2, **annotations), CLUSTER, REQUIRED)
    assert (decision.allowed, decision.code, decision.reason) == (False, 422, "invalid-group")
    assert decision.message.startswith(f"metadata.annotations[{field}]: ")


def test_the_pod_annotation_and_the_namespace_rule_choose_the_mode() -> None:
    decision = admit.mutate(lws_pod(size=8, **{"gpu-admission.io/group-topology": "required"}), CLUSTER,
                            dataclasses.replace(PREFERRED, group_levels=(CLIQUE,)))
    assert decision.reason == "group-too-large"
    policy = parse_policy({"groupTopology": {"levels": [CLIQUE]},
                           "namespaces": {"team-a": {"groupTopology": "required"}}})
    assert admit.mutate(lws_pod(size=8), CLUSTER, policy).reason == "group-too-large"
    off = admit.mutate(lws_pod(size=8, **{"gpu-admission.io/group-topology": "none"}), CLUSTER, policy)
    assert off.allowed and off.allocation.domain == "" and not off.warnings


def test_policy_group_topology_fields() -> None:
    policy = parse_policy({"groupTopology": {"levels": [CLIQUE, "example.com/pod"], "mode": "required"}})
    assert (policy.group_levels, policy.group_topology) == ((CLIQUE, "example.com/pod"), "required")
    assert (Policy().group_levels, Policy().group_topology) == (
        (CLIQUE, RACK, "topology.kubernetes.io/zone"), "preferred")
    for data, field in [({"groupTopology": {"mode": "strict"}}, "groupTopology.mode"),
                        ({"groupTopology": {"levels": []}}, "groupTopology.levels"),
                        ({"groupTopology": {"levels": [CLIQUE, CLIQUE]}}, "groupTopology.levels"),
                        ({"groupTopology": {"level": [CLIQUE]}}, "groupTopology.level"),
                        ({"namespaces": {"ml": {"groupTopology": "yes"}}}, "namespaces.ml.groupTopology")]:
        with pytest.raises(PolicyError) as err:
            parse_policy(data)
        assert err.value.field == field


# -- the domain choice against a brute force over every node ---------------------------------------------


def brute_force(nodes: list[Node], usage: dict[str, NodeUsage], levels: tuple[str, ...], gpus: int, pods: int,
                records: dict[str, GroupRecord], open_ended: bool) -> Choice | None:
    """Every domain's figures from every node, then the documented rule, spelled out."""
    for level in levels:
        values = sorted({n.labels[level] for n in nodes if level in n.labels})
        candidates = []
        for value in values:
            members = [n for n in nodes if n.labels.get(level) == value]
            capacity = sum(len(n.gpus) // gpus for n in members)
            idle = [sum(1 for u in usage[n.name].gpus if u == GpuUsage()) for n in members]
            promised = sum(r.promised_gpus for r in records.values() if (r.level, r.domain) == (level, value))
            free = max(sum(i // gpus for i in idle) - -(-promised // gpus), 0)
            candidates.append((value, capacity, free, sum(i for i in idle if i >= gpus) - promised))
        ever = [c for c in candidates if c[1] >= pods]
        if not ever:
            continue
        now = [c for c in ever if c[2] >= pods]
        if now:
            pick = sorted(now, key=lambda c: (-c[2], -c[3], c[0]) if open_ended else (c[3], c[2], c[0]))[0]
            return Choice(level, pick[0], True)
        pick = sorted(ever, key=lambda c: (-c[2], -c[1], c[0]))[0]
        return Choice(level, pick[0], False)
    return None


@settings(max_examples=150, deadline=None)
@given(
    layout=st.lists(st.tuples(st.sampled_from(["c1", "c2", "c3", None]), st.sampled_from(["r1", "r2", None]),
                              st.sampled_from([2, 4, 8]), st.integers(0, 8)), min_size=1, max_size=12),
    gpus=st.sampled_from([1, 2, 4]),
    pods=st.integers(1, 10),
    open_ended=st.booleans(),
    promises=st.lists(st.tuples(st.sampled_from([(CLIQUE, "c1"), (CLIQUE, "c2"), (RACK, "r1"), (RACK, "r2")]),
                                st.integers(0, 3)), max_size=3),
)
def test_domain_choice_matches_a_brute_force(layout: list[tuple[str | None, str | None, int, int]], gpus: int,
                                             pods: int, open_ended: bool,
                                             promises: list[tuple[tuple[str, str], int]]) -> None:
    nodes = [gpu_node(f"n{i}", clique, rack, count) for i, (clique, rack, count, _) in enumerate(layout)]
    usage = {n.name: NodeUsage(tuple(GpuUsage(81559, 100, 1, True) if g < taken else GpuUsage()
                                     for g in range(len(n.gpus))))
             for n, (_, _, _, taken) in zip(nodes, layout, strict=True)}
    records = {f"x/g{i}": GroupRecord("x", f"g{i}", level, value, still + 1, gpus, ("m",))
               for i, ((level, value), still) in enumerate(promises)}
    snap = snapshot(*nodes, usage=usage)
    index = index_of(snap)
    eligible = tuple(sorted(n.name for n in nodes))
    levels = (CLIQUE, RACK)
    table = table_of(index.statics, eligible, levels)
    found: list[Level] = rooms(table, index, gpus, records)
    present = tuple(lv for lv in levels if any(lv in n.labels for n in nodes))
    assert table.levels == present
    assert choose(found, pods, open_ended) == brute_force(nodes, usage, present, gpus, pods, records, open_ended)


@settings(max_examples=60, deadline=None)
@given(changes=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 4)), min_size=1, max_size=25),
       gpus=st.sampled_from([1, 2, 4]))
def test_counts_adjusted_as_nodes_change_class_match_a_fresh_count(changes: list[tuple[int, int]],
                                                                  gpus: int) -> None:
    """Admissions move one node at a time between classes; the table adjusts a class's counts from what
    it counted before. After every step they must equal counting from scratch."""
    index = index_of(CLUSTER)
    eligible = tuple(sorted(CLUSTER.nodes))
    table = table_of(index.statics, eligible, (CLIQUE, RACK))
    for number, taken in changes:
        name = NODES[number].name
        used = NodeUsage(tuple(GpuUsage(81559, 100, 1, True) if g < taken else GpuUsage() for g in range(4)))
        index = index.updated({name: used})
        fresh = dataclasses.replace(table, counted={}, by_state={}, capacity={})  # counts from scratch
        assert rooms(table, index, gpus, {}) == rooms(fresh, index, gpus, {})


def test_a_later_pod_whose_domain_is_full_waits_there_or_with_preferred_goes_elsewhere() -> None:
    record = GroupRecord("team-a", "lws/vllm/0", CLIQUE, "c2", 3, 4, ("uid-0",))
    full = snapshot(*NODES, usage=busy(NODES, {"c2-0", "c2-1"}))
    snap = dataclasses.replace(full, groups={record.key: record})
    preferred = admit.mutate(lws_pod(size=3, worker=1), snap, PREFERRED)
    assert preferred.allowed and preferred.allocation.node is not None
    assert not preferred.allocation.node.startswith("c2-") and preferred.allocation.domain == "nvidia.com/gpu.clique=c2"
    assert "group team-a/lws/vllm/0 placed outside nvidia.com/gpu.clique=c2: no room there for this pod now" in (
        preferred.warnings)
    required = admit.mutate(lws_pod(size=3, worker=1), snap, REQUIRED)
    assert required.allowed and required.allocation.node is None
    assert required.allocation.domain == "nvidia.com/gpu.clique=c2"
    assert any(w.startswith("no GPU free now; pod waits for one of 2 eligible node(s)") for w in required.warnings)
