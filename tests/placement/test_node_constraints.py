"""The pod's own node constraints: Kubernetes' matching semantics, and placement, eligibility and the
422 verdicts honouring them (nodeSelector, node affinity, taints, cordons, allowedModels, sharing)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonpatch
import pytest
from builders import A100, H100, L4, node, pod, snapshot

from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.domain.model import GpuUsage, Node, NodeUsage, Taint
from webhook.core.placement.context import PlacementContext
from webhook.core.placement.nodeconstraints import CORDON, Requirement, Term, Toleration, constraints_of
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.nodereach import Subset
from webhook.core.placement.place import constraints_for, place
from webhook.core.podspec.resources import parse_pod
from webhook.core.policy.model import NamespaceRule, Policy

T4 = ("Tesla-T4", 15360)
PRODUCT = "nvidia.com/gpu.product"


def labelled(n: Node, **labels: str) -> Node:
    return dataclasses.replace(n, labels={**n.labels, **{k.replace("__", "/"): v for k, v in labels.items()}})


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    item: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        item["values"] = list(values)
    return item


def chosen(nodes: list[Node], limits: dict[str, Any] | None = None, ctx: PlacementContext | None = None,
           **spec: Any) -> tuple[str | None, tuple[str, ...]]:
    """The best node and the eligible nodes for a pod with this spec."""
    request = parse_pod(pod(limits or {"nvidia.com/gpu": 1}, **spec))
    found = place(request, NodeIndex.build({n.name: n for n in nodes}, {}), ctx or PlacementContext())
    return (found.best.node if found.best else None), found.eligible


def matches(spec: dict[str, Any], n: Node) -> bool:
    return constraints_of({"spec": spec}).refusal(n) == ""


# -- Kubernetes matching semantics -----------------------------------------------------------------

ZONED = labelled(node("z", L4, 1), zone="a", rank="7", tier="gold")
BARE = node("bare", L4, 1)


@pytest.mark.parametrize(
    ("requirement", "on_zoned", "on_bare"),
    [
        (expr("zone", "In", "a", "b"), True, False),
        (expr("zone", "In", "b"), False, False),
        (expr("zone", "NotIn", "b"), True, True),  # a node without the label matches NotIn
        (expr("zone", "NotIn", "a"), False, True),
        (expr("zone", "Exists"), True, False),
        (expr("zone", "DoesNotExist"), False, True),  # ... and DoesNotExist
        (expr("rank", "Gt", "5"), True, False),
        (expr("rank", "Gt", "7"), False, False),
        (expr("rank", "Lt", "8"), True, False),
        (expr("rank", "Lt", "-3"), False, False),
        (expr("tier", "Gt", "1"), False, False),  # the node's value is no integer: no match
        (expr("rank", "Gt", "5x"), False, False),  # the pod's value is no integer: the term fails
        (expr("rank", "Gt", "5", "6"), False, False),  # Gt takes exactly one value
        (expr("rank", "Gt", " 5"), False, False),  # strconv.ParseInt takes no spaces
        (expr("zone", "In"), False, False),  # In needs values
        (expr("zone", "Exists", "a"), False, False),  # Exists takes none
        (expr("zone", "Matches", "a"), False, False),  # unknown operator
    ],
)
def test_each_operator_has_the_kubernetes_meaning(requirement, on_zoned, on_bare) -> None:
    spec = {"affinity": required({"matchExpressions": [requirement]})}
    assert (matches(spec, ZONED), matches(spec, BARE)) == (on_zoned, on_bare)


def test_terms_are_ored_and_expressions_anded() -> None:
    anded = {"matchExpressions": [expr("zone", "In", "a"), expr("tier", "In", "silver")]}
    assert not matches({"affinity": required(anded)}, ZONED)
    assert matches({"affinity": required(anded, {"matchExpressions": [expr("rank", "Exists")]})}, ZONED)
    # A term that does not parse fails alone; the others still count (LazyErrorNodeSelector).
    broken = {"matchExpressions": [expr("rank", "Lt", "many")]}
    assert matches({"affinity": required(broken, {"matchExpressions": [expr("zone", "In", "a")]})}, ZONED)


def test_an_empty_term_list_or_empty_terms_match_no_node() -> None:
    assert not matches({"affinity": required()}, ZONED)
    assert not matches({"affinity": required({})}, BARE)
    assert not matches({"affinity": required({"matchExpressions": []})}, BARE)
    assert matches({"affinity": {"nodeAffinity": {}}}, BARE)  # no required part: no constraint


def test_match_fields_on_the_node_name() -> None:
    def by_name(operator: str, *values: str) -> dict[str, Any]:
        return {"affinity": required({"matchFields": [expr("metadata.name", operator, *values)]})}

    assert matches(by_name("In", "z"), ZONED) and not matches(by_name("In", "z"), BARE)
    assert matches(by_name("NotIn", "z"), BARE) and not matches(by_name("NotIn", "z"), ZONED)
    assert not matches(by_name("In", "z", "bare"), ZONED)  # a field requirement takes exactly one value
    assert not matches(by_name("Exists"), ZONED)
    both = {"matchExpressions": [expr("zone", "In", "a")], "matchFields": [expr("metadata.name", "In", "bare")]}
    assert not matches({"affinity": required(both)}, ZONED)


def test_node_selector_needs_every_label_equal() -> None:
    assert matches({"nodeSelector": {"zone": "a", "tier": "gold"}}, ZONED)
    assert not matches({"nodeSelector": {"zone": "a", "tier": "silver"}}, ZONED)
    assert not matches({"nodeSelector": {"zone": "a"}}, BARE)
    assert not matches({"nodeSelector": {"rank": 7}}, ZONED)  # not a string: the API would refuse it


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("k", "Exists"), Taint("k", "v", "NoSchedule"), True),
        (Toleration("k", "Equal", "v"), Taint("k", "v", "NoExecute"), True),
        (Toleration("k", "", "v"), Taint("k", "v", "NoSchedule"), True),  # empty operator is Equal
        (Toleration("k", "Equal", "w"), Taint("k", "v", "NoSchedule"), False),
        (Toleration("", "Exists"), Taint("anything", "v", "NoExecute"), True),  # tolerates everything
        (Toleration("k", "Exists", effect="NoExecute"), Taint("k", "v", "NoSchedule"), False),
        (Toleration("k", "Exists", effect="NoSchedule"), Taint("k", "v", "NoSchedule"), True),
        (Toleration("j", "Exists"), Taint("k", "v", "NoSchedule"), False),
    ],
)
def test_toleration_matching(toleration, taint, tolerated) -> None:
    assert toleration.tolerates(taint) is tolerated


def test_only_noschedule_and_noexecute_taints_keep_a_pod_off() -> None:
    soft = dataclasses.replace(BARE, taints=(Taint("busy", "", "PreferNoSchedule"),))
    hard = dataclasses.replace(BARE, taints=(Taint("busy", "", "NoExecute"),))
    assert matches({}, soft) and not matches({}, hard)
    assert matches({"tolerations": [{"key": "busy", "operator": "Exists"}]}, hard)


def test_a_cordoned_node_takes_only_pods_that_tolerate_the_unschedulable_taint() -> None:
    cordoned = dataclasses.replace(BARE, unschedulable=True)
    assert constraints_of({"spec": {}}).refusal(cordoned) == "unschedulable"
    tolerant = {"tolerations": [{"key": CORDON.key, "operator": "Exists", "effect": "NoSchedule"}]}
    assert matches(tolerant, cordoned)
    assert chosen([cordoned], tolerations=tolerant["tolerations"])[0] == "bare"
    assert chosen([cordoned])[0] is None


def test_the_parsed_form() -> None:
    c = constraints_of({"spec": {"affinity": required({"matchExpressions": [expr("a", "In", "x")]})}})
    assert c.required == (Term((Requirement("a", "In", ("x",)),)),)


# -- placement honours them ----------------------------------------------------------------------


def test_node_selector_decides_the_node_and_the_card() -> None:
    nodes = [node("h1", H100, 8), node("t1", T4, 4, "none")]
    assert chosen(nodes, nodeSelector={PRODUCT: T4[0]}) == ("t1", ("t1",))
    # The recorded allocation, limits and quota are for the T4 the pod will run on, not an H100.
    d = admit.mutate(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, nodeSelector={PRODUCT: T4[0]}),
                     snapshot(*nodes), Policy())
    assert d.allowed and d.allocation is not None
    assert (d.allocation.node, d.allocation.model, d.allocation.memory_mib) == ("t1", T4[0], T4[1] // 2)


def test_required_affinity_decides_the_node() -> None:
    nodes = [labelled(node("a", H100, 8), zone="east"), labelled(node("b", H100, 8), zone="west")]
    assert chosen(nodes, affinity=required({"matchExpressions": [expr("zone", "NotIn", "east")]})) == ("b", ("b",))
    assert chosen(nodes, affinity=required({"matchFields": [expr("metadata.name", "In", "b")]})) == ("b", ("b",))


def test_untolerated_taints_keep_the_pod_off_and_tolerations_let_it_on() -> None:
    dedicated = node("a", H100, 8, taints=(Taint("dedicated", "infer", "NoSchedule"),))
    nodes = [dedicated, node("b", H100, 8)]
    assert chosen(nodes) == ("b", ("b",))
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}]
    assert chosen(nodes, tolerations=tolerations) == ("a", ("a", "b"))
    # The device taint is tolerated by the toleration the mutation adds; the policy's are added too.
    gpu_tainted = node("a", H100, 8, taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),))
    assert chosen([gpu_tainted, node("b", H100, 8)])[1] == ("a", "b")
    ctx = PlacementContext(tolerations=({"key": "dedicated", "operator": "Exists"},))
    assert chosen(nodes, ctx=ctx) == ("a", ("a", "b"))


def test_policy_tolerations_reach_placement_through_admission() -> None:
    dedicated = node("a", H100, 8, taints=(Taint("dedicated", "infer", "NoSchedule"),))
    snap = snapshot(dedicated, node("b", L4, 1, "none"))
    d = admit.mutate(pod({"nvidia.com/gpu": 2}), snap, Policy())
    assert (d.reason, d.code) == ("too-many-gpus", 422)
    assert d.message.startswith("no node matching its tolerations has 2 GPUs; the largest has 1")
    policy = Policy(tolerations=({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},))
    d = admit.mutate(pod({"nvidia.com/gpu": 2}), snap, policy)
    assert d.allowed and d.allocation is not None and d.allocation.node == "a"


def test_allowed_models_restrict_placement_of_a_pod_naming_no_model() -> None:
    snap = snapshot(node("h1", H100, 8), node("t1", T4, 4, "none"))
    policy = Policy(namespaces={"team-a": NamespaceRule(allowed_models=("T4",))})
    d = admit.mutate(pod({"nvidia.com/gpu": 1}), snap, policy)
    assert d.allowed and d.allocation is not None
    assert (d.allocation.node, d.allocation.model, d.allocation.memory_mib) == ("t1", T4[0], T4[1])
    required_term = d.patch and [op for op in d.patch if op["path"].startswith("/spec/affinity")]
    assert required_term and "h1" not in str(required_term)
    assert chosen([node("h1", H100, 8)], ctx=PlacementContext(allowed_models=("t4",)))[1] == ()


def test_allowed_models_that_no_node_has_are_a_422_naming_the_policy() -> None:
    policy = Policy(namespaces={"team-a": NamespaceRule(allowed_models=("T4",))})
    d = admit.mutate(pod({"nvidia.com/gpu": 1}), snapshot(node("h1", H100, 8)), policy)
    assert (d.allowed, d.code, d.reason) == (False, 422, "no-such-model")
    assert "namespace team-a may use only GPU models T4" in d.message and H100[0] in d.message


def test_model_and_uuid_selectors_of_every_dialect_restrict_placement() -> None:
    nodes = [node("h1", H100, 8), node("l1", L4, 2, "none")]
    assert chosen(nodes)[0] == "h1"
    for marks, best in [
        ({"nvidia.com/use-gputype": "l4"}, "l1"),
        ({"nvidia.com/nouse-gputype": "H100"}, "l1"),
        ({"nvidia.com/use-gpuuuid": "GPU-l1-1"}, "l1"),
        ({"nvidia.com/nouse-gpuuuid": ",".join(f"GPU-h1-{i}" for i in range(8))}, "l1"),
    ]:
        request = parse_pod(pod({"nvidia.com/gpu": 1}, annotations=marks))
        found = place(request, NodeIndex.build({n.name: n for n in nodes}, {}), PlacementContext())
        assert found.best is not None and found.best.node == best, marks
    hygon = [dataclasses.replace(node(name, model, 4, "none"), vendor="hygon")
             for name, model in (("d1", ("K100", 65536)), ("d2", ("Z100L", 32768)))]
    for marks, best in [({"hygon.com/use-dcutype": "Z100"}, "d2"), ({"hygon.com/nouse-dcutype": "K100"}, "d2")]:
        request = parse_pod(pod({"hygon.com/dcunum": 1}, annotations=marks))
        found = place(request, NodeIndex.build({n.name: n for n in hygon}, {}), PlacementContext())
        assert found.best is not None and found.best.node == best, marks


def test_preferred_affinity_breaks_ties_by_summed_weight() -> None:
    nodes = [labelled(node(f"n{i}", H100, 8), disk=d, zone=z)
             for i, (d, z) in enumerate([("hdd", "a"), ("ssd", "b"), ("ssd", "a")])]
    preferred = [
        {"weight": 10, "preference": {"matchExpressions": [expr("disk", "In", "ssd")]}},
        {"weight": 5, "preference": {"matchExpressions": [expr("zone", "In", "a")]}},
    ]
    spec = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}}
    request = parse_pod(pod({"nvidia.com/gpu": 1}, **spec))
    found = place(request, NodeIndex.build({n.name: n for n in nodes}, {}), PlacementContext())
    assert [o.node for o in found.options] == ["n2", "n1", "n0"]  # 15, 10, 5
    assert found.eligible == ("n0", "n1", "n2")  # preferences never exclude


def test_preference_never_beats_a_better_score() -> None:
    nodes = [labelled(node("h1", H100, 2), disk="ssd"), node("h2", H100, 2)]
    usage = {"h2": NodeUsage((GpuUsage(1000, 10, 1), GpuUsage()))}  # binpack prefers the busier node
    preferred = [{"weight": 100, "preference": {"matchExpressions": [expr("disk", "Exists")]}}]
    spec = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}}
    request = parse_pod(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, **spec))
    found = place(request, NodeIndex.build({n.name: n for n in nodes}, usage), PlacementContext())
    assert [o.node for o in found.options] == ["h2", "h1"]


# -- allowSharing: false ---------------------------------------------------------------------------


def test_sharing_forbidden_still_admits_whole_cards_through_mutate_and_validate() -> None:
    policy = Policy(namespaces={"team-a": NamespaceRule(allow_sharing=False)})
    snap = snapshot(node("h1", H100, 8))
    p = pod({"nvidia.com/gpu": 2})
    m = admit.mutate(p, snap, policy)
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    v = admit.validate(patched, snap, policy)
    assert v.allowed, v.message
    assert admit.mutate(patched, snap, policy).allowed  # the second pass too
    shared = admit.mutate(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}), snap, policy)
    assert (shared.allowed, shared.reason) == (False, "sharing-not-allowed")


# -- impossibility verdicts ------------------------------------------------------------------------


def test_too_many_gpus_for_the_selected_nodes_is_a_422_naming_the_node_selector() -> None:
    snap = snapshot(node("h1", H100, 8), node("t1", T4, 2, "none"))
    d = admit.mutate(pod({"nvidia.com/gpu": 4}, nodeSelector={PRODUCT: T4[0]}), snap, Policy())
    assert (d.allowed, d.code, d.reason) == (False, 422, "too-many-gpus")
    assert d.message.startswith(f"no node matching nodeSelector {PRODUCT}={T4[0]} has 4 GPUs; the largest has 2")


def test_memory_and_topology_verdicts_look_only_at_reachable_nodes() -> None:
    snap = snapshot(node("h1", H100, 8), labelled(node("a1", A100, 8, "paired"), pool="train"))
    selector = {"nodeSelector": {"pool": "train"}}
    d = admit.mutate(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 60000}, **selector), snap, Policy())
    assert (d.code, d.reason) == (422, "memory-too-large") and "40960 MiB" in d.message
    assert "nodeSelector pool=train" in d.message
    d = admit.mutate(pod({"nvidia.com/gpu": 4}, annotations={"gpu-admission.io/topology": "required"}, **selector),
                     snap, Policy())
    assert (d.code, d.reason) == (422, "topology-unsatisfiable") and "has 2 GPUs" in d.message


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"nodeSelector": {PRODUCT: "Tesla-V100"}}, f"1 not matching nodeSelector {PRODUCT}=Tesla-V100"),
        ({"affinity": required({"matchExpressions": [expr("zone", "In", "mars")]})},
         "1 not matching required node affinity (zone In [mars])"),
        ({"affinity": required()}, "1 not matching required node affinity (no terms)"),
    ],
)
def test_constraints_no_gpu_node_meets_are_a_422_naming_them(spec, fragment) -> None:
    d = admit.mutate(pod({"nvidia.com/gpu": 1}, **spec), snapshot(node("h1", H100, 8)), Policy())
    assert (d.allowed, d.code, d.reason) == (False, 422, "no-matching-node")
    assert fragment in d.message


def test_taints_and_cordons_on_every_gpu_node_are_a_422() -> None:
    tainted = node("h1", H100, 8, taints=(Taint("dedicated", "x", "NoExecute"),))
    cordoned = dataclasses.replace(node("h2", H100, 8), unschedulable=True)
    d = admit.mutate(pod({"nvidia.com/gpu": 1}), snapshot(tainted, cordoned), Policy())
    assert (d.code, d.reason) == (422, "no-matching-node")
    assert "1 with a NoSchedule/NoExecute taint it does not tolerate; 1 cordoned" in d.message


def test_constraints_for_adds_the_vendor_and_policy_tolerations() -> None:
    request = parse_pod(pod({"hygon.com/dcunum": 1}))
    c = constraints_for(request, ({"key": "x", "operator": "Exists"},))
    assert Toleration("hygon.com/dcunum", "Exists", "", "NoSchedule") in c.tolerations
    assert Toleration("x", "Exists") in c.tolerations


def test_labels_taints_and_cordons_of_node_objects_reach_the_decision() -> None:
    def node_object(name: str, product: str, **spec: Any) -> dict[str, Any]:
        labels = {PRODUCT: product, "nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "15360", "zone": name}
        return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": spec,
                "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}}}

    objects = [
        node_object("a", "Tesla-T4", taints=[{"key": "maintenance", "value": "x", "effect": "NoExecute"}]),
        node_object("b", "Tesla-T4", unschedulable=True),
        node_object("c", "Tesla-T4"),
        node_object("d", "Tesla-T4"),
        {"kind": "Namespace", "metadata": {"name": "team-a", "labels": {"gpu-admission.io/enabled": "true"}}},
    ]
    snap = build_snapshot(objects)
    d = admit.mutate(pod({"nvidia.com/gpu": 1}, nodeSelector={"zone": "d"}), snap, Policy())
    assert d.allowed and d.allocation is not None and d.allocation.node == "d"
    in_a_or_b = required({"matchExpressions": [expr("zone", "In", "a", "b")]})
    d = admit.mutate(pod({"nvidia.com/gpu": 1}, affinity=in_a_or_b), snap, Policy())
    assert (d.code, d.reason) == (422, "no-matching-node")
    assert "2 not matching required node affinity (zone In [a, b]); 1 with a" in d.message
    assert "it does not tolerate; 1 cordoned" in d.message


def test_cordoned_nodes_are_named_in_the_verdict() -> None:
    snap = snapshot(dataclasses.replace(node("h1", H100, 8), unschedulable=True), node("l1", L4, 2, "none"))
    d = admit.mutate(pod({"nvidia.com/gpu": 4}, nodeSelector={PRODUCT: H100[0]}), snap, Policy())
    assert (d.code, d.reason) == (422, "no-matching-node") and "1 not matching nodeSelector" in d.message
    d = admit.mutate(pod({"nvidia.com/gpu": 4}), snap, Policy())
    assert (d.code, d.reason) == (422, "too-many-gpus")
    expected = "no node matching the pod's constraints (cordoned nodes aside) has 4 GPUs; the largest has 2"
    assert d.message.startswith(expected)


def test_a_pod_waiting_for_a_full_cluster_records_the_card_it_can_reach() -> None:
    full = {"t1": NodeUsage((GpuUsage(T4[1], 100, 1, True),) * 2)}
    snap = snapshot(node("a1", H100, 8), node("t1", T4, 2, "none"), usage=full)
    d = admit.mutate(pod({"nvidia.com/gpu": 1}, nodeSelector={PRODUCT: T4[0]}), snap, Policy())
    assert d.allowed and d.allocation is not None
    assert (d.allocation.node, d.allocation.model, d.allocation.memory_mib) == (None, T4[0], T4[1])


@pytest.mark.parametrize("kept", [{"b"}, {"a", "c", "d"}, set(), {"a", "b", "c", "d"}])
def test_a_subset_stores_the_smaller_side_and_reads_the_same(kept) -> None:
    names = ("a", "b", "c", "d")
    subset = Subset(names, kept)
    assert len(subset) == len(kept) and list(subset) == sorted(kept)
    assert [n for n in names if n in subset] == sorted(kept)
