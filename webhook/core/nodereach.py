"""The nodes of each shape a pod's own constraints let it reach, memoised per set of constraints.

Labels, names and taints are not part of a node shape (a hostname label would make every node a shape
of its own), so a pod with a nodeSelector, required affinity or a taint it does not tolerate may reach
some nodes of a shape and not others. `reach_of` answers once per (constraints, node set) from the
label index; placement then filters the names of the few classes it looks at, memoised per class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .nodeconstraints import AFFINITY, SELECTOR, TAINT, NodeConstraints
from .nodeindex import Shape, Statics

_MEMO = 256
_FILTERED = 4096
_NOTHING: Mapping[str, int] = {}


@dataclass(eq=False)
class ShapeReach:
    """`names[shape number]`: the nodes of that shape the pod may use, for the shapes it cannot use whole
    (absent: every node of the shape); `rejected[shape number]`: how many fell out, by reason."""

    names: dict[int, frozenset[str]]
    rejected: dict[int, dict[str, int]]
    weights: Mapping[str, int]  # preferred node affinity: summed weights of the terms a node meets
    filtered: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    grouped: dict[int, tuple[tuple[str, ...], list[tuple[int, tuple[str, ...]]]]] = field(default_factory=dict)

    def within(self, names: tuple[str, ...], allowed: frozenset[str]) -> tuple[str, ...]:
        """`names` (a class's, sorted) restricted to `allowed`; memoised by the identity of the tuple,
        which a class keeps for as long as its members do."""
        key = id(names)
        hit = self.filtered.get(key)
        if hit is not None and hit[0] is names:
            return hit[1]
        kept = tuple(n for n in names if n in allowed)
        if len(self.filtered) >= _FILTERED:
            self.filtered.clear()
        self.filtered[key] = (names, kept)
        return kept

    def by_weight(self, names: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
        """A class's names split by preferred-affinity weight (each group sorted), memoised like `within`."""
        key = id(names)
        hit = self.grouped.get(key)
        if hit is not None and hit[0] is names:
            return hit[1]
        groups = weight_groups(names, self.weights)
        if len(self.grouped) >= _FILTERED:
            self.grouped.clear()
        self.grouped[key] = (names, groups)
        return groups


def reach_of(statics: Statics, constraints: NodeConstraints) -> ShapeReach | None:
    """Where the pod may go; None when its constraints exclude no node and express no preference."""
    if not constraints.by_labels and not statics.tainted and not constraints.preferred:
        return None
    memo = statics.reach
    found = memo.get(constraints)
    if found is None:
        if len(memo) >= _MEMO:
            memo.clear()
        found = memo[constraints] = _compute(statics, constraints)
    return found if isinstance(found, ShapeReach) else None


def _compute(statics: Statics, constraints: NodeConstraints) -> ShapeReach | str:
    index = statics.label_index()
    weights = index.preferences(constraints) if constraints.preferred else _NOTHING
    reach = index.reach(constraints)
    if reach.allowed is None and not reach.tainted:
        return ShapeReach({}, {}, weights) if weights else "everywhere"
    shape_of = statics.shape_of

    def group(names: frozenset[str]) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for name in names:
            out.setdefault(shape_of[name].number, set()).add(name)
        return out

    selected = group(reach.by_selector) if reach.by_selector is not None else None
    allowed = group(reach.allowed) if reach.allowed is not None else None
    tainted = group(reach.tainted)
    names: dict[int, frozenset[str]] = {}
    rejected: dict[int, dict[str, int]] = {}
    for shape in statics.shapes:
        n = shape.number
        total = len(shape.names)
        by_selector = len(selected.get(n, ())) if selected is not None else total
        by_labels = len(allowed.get(n, ())) if allowed is not None else by_selector
        lost = tainted.get(n, set())
        if by_labels - len(lost) == total:
            continue
        counts = {SELECTOR: total - by_selector, AFFINITY: by_selector - by_labels, TAINT: len(lost)}
        rejected[n] = {k: v for k, v in counts.items() if v}
        kept = allowed.get(n, set()) if allowed is not None else set(shape.names)
        names[n] = frozenset(kept - lost)
    return ShapeReach(names, rejected, weights)


def shape_names(reach: ShapeReach | None, shape: Shape) -> frozenset[str] | None:
    """The nodes of `shape` the pod may use, None for all of them."""
    return reach.names.get(shape.number) if reach is not None else None


def count_rejections(reach: ShapeReach | None, shape: Shape, rejected: dict[str, int]) -> None:
    if reach is not None:
        for reason, count in reach.rejected.get(shape.number, _NOTHING).items():
            rejected[reason] = rejected.get(reason, 0) + count


def weight_groups(names: tuple[str, ...], weights: Mapping[str, int]) -> list[tuple[int, tuple[str, ...]]]:
    """A class's names split by preferred-affinity weight (names stay sorted in each group)."""
    if not weights:
        return [(0, names)]
    groups: dict[int, list[str]] = {}
    for name in names:
        groups.setdefault(weights.get(name, 0), []).append(name)
    if len(groups) == 1:
        return [(next(iter(groups)), names)]
    return [(w, tuple(g)) for w, g in groups.items()]
