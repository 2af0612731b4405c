"""A pod's own node constraints, with the Kubernetes scheduler's semantics.

`spec.nodeSelector`, required and preferred node affinity (k8s.io/component-helpers
scheduling/corev1/nodeaffinity over labels.Requirement), tolerations against NoSchedule and NoExecute
taints (core/v1 Toleration.ToleratesTaint, the TaintToleration filter) and cordoned nodes (the
NodeUnschedulable filter, which a toleration of node.kubernetes.io/unschedulable lifts).
`NodeConstraints.refusal` judges one node; `LabelIndex` answers for a whole cluster with set operations
over an inverted label index, so that placement never tests every node against a pod.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

from webhook.core.domain.model import Node, Taint
from webhook.core.domain.podview import PodView
from webhook.core.podspec.view import as_view

SCHEDULING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # PreferNoSchedule only scores
CORDON = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
_CORDON_KEYS = ("", CORDON.key)  # the keys of tolerations that can tolerate it
LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_INT64 = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64): no spaces, no underscores

# Why a node is out, in the order the checks run (also placement's `rejected` reasons).
SELECTOR, AFFINITY, TAINT, CORDONED = "node-selector", "node-affinity", "taint", "unschedulable"


def parse_int64(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64), None where it fails."""
    if not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions (labels) or matchFields entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def label_error(self) -> str:
        """labels.NewRequirement's checks: a requirement that fails them fails its whole term."""
        op, n = self.operator, len(self.values)
        if op not in LABEL_OPERATORS:
            return f"operator {op!r} is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"
        if not self.key:
            return "key is empty"
        if op in ("In", "NotIn") and n == 0:
            return f"{op} needs at least one value"
        if op in ("Exists", "DoesNotExist") and n:
            return f"{op} takes no values"
        if op in ("Gt", "Lt") and (n != 1 or parse_int64(self.values[0]) is None):
            return f"{op} needs exactly one integer value"
        return ""

    def field_error(self) -> str:
        if self.operator not in ("In", "NotIn"):
            return f"matchFields operator {self.operator!r} is not In or NotIn"
        if len(self.values) != 1:
            return f"matchFields {self.operator} needs exactly one value"
        return ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        """labels.Requirement.Matches (the requirement is valid)."""
        op = self.operator
        value = labels.get(self.key)
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        have = parse_int64(value) if value is not None else None
        if have is None:
            return False
        bound = parse_int64(self.values[0])
        assert bound is not None
        return have > bound if op == "Gt" else have < bound

    def matches_field(self, node: Node) -> bool:
        # The node's only selectable field is metadata.name; another key reads as "" (fields.Set.Get).
        have = node.name if self.key == "metadata.name" else ""
        return (have == self.values[0]) == (self.operator == "In")


@dataclass(frozen=True, slots=True)
class Term:
    """A nodeSelectorTerm: its expressions and fields ANDed. `error`: it does not parse and matches
    no node (LazyErrorNodeSelector), while the other terms still count."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()
    error: str = ""

    def matches(self, node: Node) -> bool:
        if self.error:
            return False
        return all(r.matches(node.labels) for r in self.expressions) and all(
            r.matches_field(node) for r in self.fields
        )

    def text(self) -> str:
        parts = [_requirement_text(r) for r in self.expressions + self.fields]
        return " and ".join(parts) if parts else "(empty term)"


def _requirement_text(r: Requirement) -> str:
    if r.operator in ("Exists", "DoesNotExist"):
        return f"{r.key} {r.operator}"
    return f"{r.key} {r.operator} [{', '.join(r.values)}]"


class Toleration(NamedTuple):
    """A pod toleration (a named tuple: every admission parses the pod's, and a tuple is cheap to make)."""

    key: str = ""
    operator: str = ""  # "" is Equal
    value: str = ""
    effect: str = ""  # "" matches every effect

    def tolerates(self, taint: Taint) -> bool:
        """core/v1 Toleration.ToleratesTaint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


class NodeConstraints:
    """What the pod itself demands of a node. Immutable by convention and hashable: placement memoises
    per value. A plain class with slots, not a frozen dataclass: one is made per admission, and this
    costs a third as much.

    `selector`: nodeSelector, sorted (a None value: not a string, matches nothing). `required` is None
    when the pod has no required node affinity; an empty tuple matches no node. `preferred`: (weight,
    term). `cordon_ok`: the pod tolerates node.kubernetes.io/unschedulable, so cordoned nodes may host it.
    `by_labels`: labels or names restrict the nodes (else only taints and cordons can).
    """

    __slots__ = ("selector", "required", "preferred", "tolerations", "digest", "cordon_ok", "by_labels")

    def __init__(
        self,
        selector: tuple[tuple[str, str | None], ...] = (),
        required: tuple[Term, ...] | None = None,
        preferred: tuple[tuple[int, Term], ...] = (),
        tolerations: tuple[Toleration, ...] = (),
    ) -> None:
        self.selector = selector
        self.required = required
        self.preferred = preferred
        self.tolerations = tolerations
        self.digest = hash((selector, required, preferred, tolerations))  # hashed once, not per look-up
        self.cordon_ok = False
        for t in tolerations:  # a loop: a generator costs more than the few tolerations a pod has
            if t.key in _CORDON_KEYS and t.tolerates(CORDON):
                self.cordon_ok = True
                break
        self.by_labels = bool(selector) or required is not None  # else only taints and cordons restrict

    def _fields(self) -> tuple[Any, ...]:
        return self.selector, self.required, self.preferred, self.tolerations

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeConstraints):
            return NotImplemented
        return self is other or (self.digest == other.digest and self._fields() == other._fields())

    def __hash__(self) -> int:
        return self.digest

    def __repr__(self) -> str:
        return "NodeConstraints(selector={!r}, required={!r}, preferred={!r}, tolerations={!r})".format(*self._fields())

    def tolerates(self, taint: Taint) -> bool:
        return any(t.tolerates(taint) for t in self.tolerations)

    def untolerated(self, node: Node) -> Taint | None:
        for taint in node.taints:
            if taint.effect in SCHEDULING_EFFECTS and not self.tolerates(taint):
                return taint
        return None

    def refusal(self, node: Node) -> str:
        """Why the scheduler would never bind the pod to this node ("" when it could)."""
        labels = node.labels
        if any(value is None or labels.get(key) != value for key, value in self.selector):
            return SELECTOR
        if self.required is not None and not any(term.matches(node) for term in self.required):
            return AFFINITY
        if self.untolerated(node) is not None:
            return TAINT
        if node.unschedulable and not self.cordon_ok:
            return CORDONED
        return ""

    def preference(self, node: Node) -> int:
        """The scheduler's NodeAffinity score before normalising: weights of the preferred terms met."""
        return sum(weight for weight, term in self.preferred if term.matches(node))

    def describe(self, reason: str) -> str:
        """The constraint behind a reason, as a user wrote it."""
        if reason == SELECTOR:
            shown = ", ".join(f"{k}={v if v is not None else '(not a string)'}" for k, v in self.selector)
            return f"nodeSelector {shown}"
        if reason == AFFINITY:
            terms = self.required or ()
            shown = " or ".join(f"({t.text()}{': ' + t.error if t.error else ''})" for t in terms)
            return f"required node affinity {shown or '(no terms)'}"
        if reason == TAINT:
            return "its tolerations"
        return "no cordon"


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _requirements(value: Any) -> tuple[Requirement, ...]:
    out = []
    for item in value if isinstance(value, list) else ():
        item = item if isinstance(item, Mapping) else {}
        key, operator = str(item.get("key") or ""), str(item.get("operator") or "")
        out.append(Requirement(key, operator, _strings(item.get("values"))))
    return tuple(out)


def _term(value: Any) -> Term | None:
    """A parsed term, or None for an empty one (which selects nothing)."""
    if not isinstance(value, Mapping):
        return None
    expressions = _requirements(value.get("matchExpressions"))
    fields = _requirements(value.get("matchFields"))
    if not expressions and not fields:
        return None
    errors = [e for e in (r.label_error() for r in expressions) if e]
    errors += [e for e in (r.field_error() for r in fields) if e]
    return Term(expressions, fields, "; ".join(errors))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value or "")


def _toleration(value: Any) -> Toleration:
    if type(value) is not dict and not isinstance(value, Mapping):
        return Toleration()
    get = value.get
    key, operator, text, effect = get("key") or "", get("operator") or "", get("value") or "", get("effect") or ""
    if str is type(key) is type(operator) is type(text) is type(effect):  # as the API server delivers them
        return Toleration(key, operator, text, effect)
    return Toleration(_text(key), _text(operator), _text(text), _text(effect))


def tolerations_of(items: Iterable[Mapping[str, Any]]) -> tuple[Toleration, ...]:
    return tuple(_toleration(t) for t in items)


def _is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    return type(value) is dict or isinstance(value, Mapping)  # the ABC check only for what JSON did not make


def constraints_of(pod: Mapping[str, Any] | PodView, extra_tolerations: tuple[Toleration, ...] = ()
                   ) -> NodeConstraints:
    """The pod's constraints (read from its view), with the tolerations the webhook adds
    (`extra_tolerations`). Never raises: a malformed entry matches as the scheduler would read it (or
    matches nothing)."""
    view = as_view(pod)
    raw_selector, affinity, raw_tolerations = view.node_selector, view.affinity, view.tolerations
    selector = tuple(
        sorted(((str(k), v if isinstance(v, str) else None) for k, v in raw_selector.items()), key=lambda kv: kv[0])
    ) if raw_selector else ()  # fmt: skip
    node_affinity = affinity.get("nodeAffinity") if affinity else None  # the view's fields are mappings
    required: tuple[Term, ...] | None = None
    preferred: list[tuple[int, Term]] = []
    if node_affinity and _is_map(node_affinity):
        hard = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if _is_map(hard):
            terms = hard.get("nodeSelectorTerms")
            required = tuple(t for t in map(_term, terms if isinstance(terms, list) else ()) if t is not None)
        for item in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ():
            weight = item.get("weight") if isinstance(item, Mapping) else None
            term = _term(item.get("preference")) if isinstance(item, Mapping) else None
            if isinstance(weight, int) and weight and term is not None and not term.error:
                preferred.append((weight, term))
    tolerations = [*map(_toleration, raw_tolerations), *extra_tolerations] if raw_tolerations else extra_tolerations
    return NodeConstraints(selector, required, tuple(preferred), tuple(dict.fromkeys(tolerations)))


@dataclass(frozen=True)
class Reach:
    """The nodes a pod's constraints leave it: `allowed` (None: every node) minus `tainted`, with the
    intermediate sets that say why the others fell out."""

    by_selector: frozenset[str] | None
    allowed: frozenset[str] | None
    tainted: frozenset[str]  # allowed by labels, but with a taint the pod does not tolerate

    def admits(self, name: str) -> bool:
        return (self.allowed is None or name in self.allowed) and name not in self.tainted


class LabelIndex:
    """Node names by label value and by taint set, built once per set of nodes."""

    def __init__(self, nodes: Mapping[str, Node]) -> None:
        self.names = frozenset(nodes)
        self.by_label: dict[str, dict[str, set[str]]] = {}
        self.by_taints: dict[tuple[Taint, ...], list[str]] = {}
        for name, node in nodes.items():
            for key, value in node.labels.items():
                self.by_label.setdefault(key, {}).setdefault(value, set()).add(name)
            taints = tuple(t for t in node.taints if t.effect in SCHEDULING_EFFECTS)
            if taints:
                self.by_taints.setdefault(taints, []).append(name)

    def _labelled(self, r: Requirement) -> frozenset[str]:
        values = self.by_label.get(r.key, {})
        op = r.operator
        if op in ("In", "NotIn"):
            found = frozenset().union(*(values.get(v, ()) for v in r.values))
            return found if op == "In" else self.names - found
        if op in ("Exists", "DoesNotExist"):
            found = frozenset().union(*values.values())
            return found if op == "Exists" else self.names - found
        return frozenset().union(*(names for value, names in values.items() if r.matches({r.key: value})))

    def _fielded(self, r: Requirement) -> frozenset[str]:
        if r.key != "metadata.name":
            return self.names if (r.values[0] == "") == (r.operator == "In") else frozenset()
        one = frozenset((r.values[0],)) & self.names
        return one if r.operator == "In" else self.names - one

    def term(self, term: Term) -> frozenset[str]:
        if term.error:
            return frozenset()
        sets = sorted((*map(self._labelled, term.expressions), *map(self._fielded, term.fields)), key=len)
        return sets[0].intersection(*sets[1:])

    def reach(self, c: NodeConstraints) -> Reach:
        by_selector: frozenset[str] | None = None
        if c.selector:
            sets = [frozenset() if v is None else frozenset(self.by_label.get(k, {}).get(v, ())) for k, v in c.selector]
            sets.sort(key=len)
            by_selector = sets[0].intersection(*sets[1:])
        allowed = by_selector
        if c.required is not None:
            matched = frozenset().union(*map(self.term, c.required))
            allowed = matched if allowed is None else allowed & matched
        tainted: set[str] = set()
        for taints, names in self.by_taints.items():
            if not all(c.tolerates(t) for t in taints):
                tainted.update(n for n in names if allowed is None or n in allowed)
        return Reach(by_selector, allowed, frozenset(tainted))

    def preferences(self, c: NodeConstraints) -> dict[str, int]:
        """Summed preferred-term weights, for the nodes that meet at least one term."""
        weights: dict[str, int] = {}
        for weight, term in c.preferred:
            for name in self.term(term):
                weights[name] = weights.get(name, 0) + weight
        return weights
