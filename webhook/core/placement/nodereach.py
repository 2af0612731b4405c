"""The nodes of each shape a pod's own constraints let it reach, memoised per set of constraints.

Labels, names and taints are not part of a node shape (a hostname label would make every node a shape
of its own), so a pod with a nodeSelector, required affinity or a taint it does not tolerate may reach
some nodes of a shape and not others. `reach_of` answers once per (constraints, node set) from the
label index; placement then filters the names of the few classes it looks at, memoised per class.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .nodeconstraints import AFFINITY, SELECTOR, TAINT, NodeConstraints
from .nodeindex import Shape, Statics

_MEMO = 64  # sets of constraints remembered per node set (each holds at most half the node names)
_FILTERED = 4096
_NOTHING: Mapping[str, int] = {}


class Subset:
    """Some of a shape's nodes (`names`, sorted), stored as the smaller of the kept and the excluded
    names: a memoised reach never holds more than half of the cluster's names."""

    __slots__ = ("_names", "_kept", "_excluded", "_count")

    def __init__(self, names: tuple[str, ...], kept: set[str]) -> None:
        self._names = names
        self._count = len(kept)
        fewer = 2 * len(kept) <= len(names)
        self._kept = frozenset(kept) if fewer else None
        self._excluded = None if fewer else frozenset(n for n in names if n not in kept)

    def __contains__(self, name: object) -> bool:
        if self._excluded is not None:
            return name not in self._excluded
        assert self._kept is not None
        return name in self._kept

    def __len__(self) -> int:
        return self._count

    def of(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """`names` (sorted) that are in the subset, in order. A few kept names among many (a pod held to
        one topology domain): intersected in C, not tested one by one."""
        if self._kept is not None and 8 * len(self._kept) < len(names):
            return tuple(sorted(self._kept.intersection(names)))
        return tuple(n for n in names if n in self)

    def __iter__(self) -> Iterator[str]:
        """In name order."""
        if self._excluded is not None:
            excluded = self._excluded
            return (n for n in self._names if n not in excluded)
        assert self._kept is not None
        return iter(sorted(self._kept))


@dataclass(eq=False)
class ShapeReach:
    """`names[shape number]`: the nodes of that shape the pod may use, for the shapes it cannot use whole
    (absent: every node of the shape); `rejected[shape number]`: how many fell out, by reason."""

    names: dict[int, Subset]
    rejected: dict[int, dict[str, int]]
    weights: Mapping[str, int]  # preferred node affinity: summed weights of the terms a node meets
    filtered: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    grouped: dict[int, tuple[tuple[str, ...], list[tuple[int, tuple[str, ...]]]]] = field(default_factory=dict)

    def within(self, names: tuple[str, ...], allowed: Subset) -> tuple[str, ...]:
        """`names` (a class's, sorted) restricted to `allowed`; memoised by the identity of the tuple,
        which a class keeps for as long as its members do."""
        key = id(names)
        hit = self.filtered.get(key)
        if hit is not None and hit[0] is names:
            return hit[1]
        kept = allowed.of(names)
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
    names: dict[int, Subset] = {}
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
        names[n] = Subset(shape.names, kept - lost)
    return ShapeReach(names, rejected, weights)


def shape_names(reach: ShapeReach | None, shape: Shape) -> Subset | None:
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
