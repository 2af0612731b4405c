"""Over random clusters and pods, placement picks only nodes the pod's own constraints allow, and every
such node that fits is eligible: checked against a brute-force matcher written apart from the code."""

from __future__ import annotations

import dataclasses
from typing import Any

from builders import A100, H100, L4, node, pod, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.core.admission import admit
from webhook.core.domain.model import Node, Taint
from webhook.core.placement.context import PlacementContext
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import commit, constraints_for, place
from webhook.core.podspec.resources import parse_pod
from webhook.core.policy.model import NamespaceRule, Policy

TAINTS = (Taint("dedicated", "ml", "NoSchedule"), Taint("spot", "", "NoExecute"), Taint("soft", "", "PreferNoSchedule"),
          Taint("dedicated", "web", "NoSchedule"))
TOLERATIONS = (
    {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Exists"},
    {"key": "spot", "operator": "Exists", "effect": "NoSchedule"},  # the wrong effect: does not tolerate
    {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
    {"operator": "Exists"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Node]:
    nodes = {}
    for i in range(draw(st.integers(1, 7))):
        model, count = draw(st.sampled_from([(H100, 8), (L4, 2), (A100, 4)]))
        labels = {"nvidia.com/gpu.product": model[0]}
        for key, values in (("zone", ["a", "b"]), ("rank", ["1", "5", "12", "x", "-3"]), ("pool", ["p"])):
            value = draw(st.sampled_from([None, *values]))
            if value is not None:
                labels[key] = value
        taints = tuple(draw(st.sets(st.sampled_from(TAINTS), max_size=2)))
        n = node(f"n{i}", model, count, "none", taints=taints)
        nodes[n.name] = dataclasses.replace(n, labels=labels, unschedulable=draw(st.integers(0, 9)) == 0)
    return nodes


@st.composite
def requirements(draw: st.DrawFn) -> dict[str, Any]:
    operator = draw(st.sampled_from(OPERATORS))
    key = draw(st.sampled_from(["zone", "rank", "pool", "nvidia.com/gpu.product"]))
    if operator in ("In", "NotIn"):
        values = draw(st.lists(st.sampled_from(["a", "b", "p", "5", L4[0]]), min_size=0, max_size=2))
    elif operator in ("Gt", "Lt"):
        values = draw(st.lists(st.sampled_from(["0", "4", "11", "x"]), min_size=1, max_size=2))
    else:
        values = draw(st.sampled_from([[], [], ["a"]]))
    return {"key": key, "operator": operator, "values": values}


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(st.dictionaries(st.sampled_from(["zone", "pool"]), st.sampled_from(["a", "p"]),
                                                    min_size=1, max_size=2))
    if draw(st.booleans()):
        terms = []
        for _ in range(draw(st.integers(0, 3))):
            term: dict[str, Any] = {"matchExpressions": draw(st.lists(requirements(), max_size=2))}
            if draw(st.integers(0, 3)) == 0:
                term["matchFields"] = [{"key": "metadata.name", "operator": draw(st.sampled_from(["In", "NotIn"])),
                                        "values": [draw(st.sampled_from(["n0", "n1", "n2"]))]}]
            terms.append(term)
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                             {"nodeSelectorTerms": terms}}}
    spec["tolerations"] = list(draw(st.sets(st.sampled_from(range(len(TOLERATIONS))), max_size=2)))
    spec["tolerations"] = [TOLERATIONS[i] for i in spec["tolerations"]]
    return spec


# -- the reference: Kubernetes' rules, one node at a time ---------------------------------------------------


def _integer(text: str) -> int | None:
    body = text[1:] if text[:1] in "+-" else text
    return int(text) if body.isdigit() and body.isascii() else None


def _requirement(r: dict[str, Any], labels: dict[str, str]) -> bool | None:
    """True / False, or None when the requirement is invalid (its term then matches nothing)."""
    op, key, values = r["operator"], r["key"], r.get("values") or []
    has = key in labels
    if op == "In":
        return None if not values else has and labels[key] in values
    if op == "NotIn":
        return None if not values else not has or labels[key] not in values
    if op in ("Exists", "DoesNotExist"):
        return None if values else has == (op == "Exists")
    if len(values) != 1 or _integer(values[0]) is None:
        return None
    mine = _integer(labels[key]) if has else None
    if mine is None:
        return False
    return mine > _integer(values[0]) if op == "Gt" else mine < _integer(values[0])  # type: ignore[operator]


def _term(term: dict[str, Any], n: Node) -> bool:
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False
    results = [_requirement(r, dict(n.labels)) for r in expressions]
    for f in fields:
        results.append((n.name == f["values"][0]) == (f["operator"] == "In") if len(f["values"]) == 1 else None)
    return None not in results and all(results)


def _tolerated(taint: Taint, tolerations: list[dict[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        if t.get("key") and t["key"] != taint.key:
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.value:
            return True
    return False


def allowed(n: Node, spec: dict[str, Any]) -> bool:
    if any(n.labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
        return False
    affinity = spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if affinity is not None and not any(_term(t, n) for t in affinity["nodeSelectorTerms"]):
        return False
    tolerations = [*spec["tolerations"], {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if any(t.effect in ("NoSchedule", "NoExecute") and not _tolerated(t, tolerations) for t in n.taints):
        return False
    cordon = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
    return not n.unschedulable or _tolerated(cordon, tolerations)


def idle(index: NodeIndex, name: str) -> int:
    return sum(1 for g in index.usage(name).gpus if g.tasks == 0 and g.memory_mib == 0 and not g.exclusive)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), pods=st.lists(st.tuples(specs(), st.sampled_from([1, 1, 2, 4])), min_size=1, max_size=5))
def test_chosen_nodes_satisfy_the_pods_constraints_and_every_fitting_node_is_eligible(nodes, pods) -> None:
    index = NodeIndex.build(nodes, {})
    ctx = PlacementContext(limit=10)
    for spec, gpus in pods:
        request = parse_pod(pod({"nvidia.com/gpu": gpus}, **spec))
        found = place(request, index, ctx)
        ok = {name for name, n in nodes.items() if allowed(n, spec)}
        one_by_one = constraints_for(request, ())
        assert {name for name, n in nodes.items() if one_by_one.refusal(n) == ""} == ok, spec
        assert set(found.eligible) == {name for name in ok if len(nodes[name].gpus) >= gpus}, spec
        free = {name for name in found.eligible if idle(index, name) >= gpus}
        assert {o.node for o in found.options} <= free
        assert len(found.options) == min(len(free), ctx.limit), (spec, found.rejected)
        if found.best is not None:  # take it, so that later pods see a changed cluster
            name = found.best.node
            index.apply(name, commit(index.usage(name), found.best, request, nodes[name]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), spec=specs(), gpus=st.sampled_from([1, 2, 4, 8]),
       allowed_models=st.sampled_from([(), ("H100",), ("L4", "A100")]),
       policy_tolerations=st.sampled_from([(), (TOLERATIONS[1],)]))
def test_admission_allocates_only_reachable_nodes_and_refuses_only_the_impossible(
    nodes, spec, gpus, allowed_models, policy_tolerations
) -> None:
    policy = Policy(tolerations=policy_tolerations,
                    namespaces={"team-a": NamespaceRule(allowed_models=allowed_models)})
    decision = admit.mutate(pod({"nvidia.com/gpu": gpus}, **spec), snapshot(*nodes.values()), policy)
    widened = {**spec, "tolerations": [*spec["tolerations"], *policy_tolerations]}
    possible = {name for name, n in nodes.items() if allowed(n, widened) and len(n.gpus) >= gpus
                and (not allowed_models or any(m.lower() in n.gpu_model.lower() for m in allowed_models))}
    if possible:
        assert decision.allowed, decision.message
        assert decision.allocation is not None and decision.allocation.node in possible  # an empty cluster
    else:
        assert (decision.allowed, decision.code) == (False, 422), decision.message
