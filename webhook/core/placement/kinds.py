"""A workload mix as the fragmentation measure takes it: its kinds of task, numbered by one registry.

A state's value for one kind of task does not depend on the mix's weights, so every state keeps its
values in a vector indexed by kind (core/placement/fragmentation.py, `Measured`): the registry gives each
kind its index, and a compiled mix (`KindMix`) knows its kinds' indices and weights, so that a new mix (a
learned mix moves with the pods) costs a weighted sum per state, not a new evaluation.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from functools import lru_cache
from operator import itemgetter

from .context import WorkloadShape
from .waste import MILLI, Kind, Waste, fill_chances, waste_of

# Kinds of a mix that share GPUs, share and models: ((GPUs, share), models, the largest CPU and memory
# any of them needs, the members' indices, the members as (index, CPU, memory), the indices as bits).
Group = tuple[tuple[int, int], tuple[str, ...], int, int, tuple[int, ...], tuple[tuple[int, int, int], ...], int]


class KindRegistry:
    """Kinds of task -> their index in each state's vector of per-kind values.

    Append-only; when full, it is dropped (`generation`): compiled mixes re-index, and vectors indexed by
    the old generation are computed again when next read."""

    __slots__ = ("indices", "shares", "generation")

    def __init__(self) -> None:
        self.indices: dict[tuple[int, int, int, int, tuple[str, ...]], int] = {}
        self.shares = 0  # the indices of the single-GPU kinds (their values read the waste table), as bits
        self.generation = 0

    def index(self, kind: Kind, drop: bool = True) -> int:
        key = (kind[0], kind[1], kind[3], kind[4], kind[5])
        found = self.indices.get(key)
        if found is None:
            if drop and len(self.indices) >= KINDS_LIMIT:
                self.drop()
            found = self.indices[key] = len(self.indices)
            if kind[0] == 1:
                self.shares |= 1 << found
        return found

    def drop(self) -> None:
        """Forget every kind; compiled mixes re-index, vectors of the old generation are computed again."""
        self.indices.clear()
        self.shares = 0
        self.generation += 1


KINDS_LIMIT = 1 << 12
REGISTRY = KindRegistry()


class KindMix:
    """A compiled mix. Hashed by identity, so that memo lookups do not rehash every kind.

    `entries`: (index of the kind in every state's vector of per-kind values, weight, kind), re-indexed
    when the kind registry was dropped (`generation`); `groups`: the same kinds by (GPUs, share, models),
    for filling a state's vector a group at a time; `mask`: the kinds' indices as bits; `waste`: the
    waste table of its card-sharing shares (`sizes`), with the answers computed with it."""

    __slots__ = ("kinds", "entries", "generation", "indices", "pick", "weights", "groups", "mask", "sizes", "waste",
                 "wanting", "distances")

    def __init__(self, kinds: tuple[Kind, ...]) -> None:
        self.kinds = kinds
        # The shares single-GPU kinds take of a card, each with its chance of filling a remainder it fits.
        self.sizes = fill_chances(kinds)
        self.waste: Waste = waste_of(self.sizes)
        self.entries: tuple[tuple[int, float, Kind], ...] = ()
        self.generation = -1
        self.indices: tuple[int, ...] = ()  # the entries' indices and weights apart, for the weighted sum
        self.pick: Callable[[array[float]], tuple[float, ...]] = _none  # a state's values at `indices`, in C
        self.weights: tuple[float, ...] = tuple(k[2] for k in kinds)
        self.groups: tuple[Group, ...] = ()
        self.mask = 0
        # Missing kinds (bits) -> the groups holding them: after a mix gains a kind, every state it weighs
        # misses the same few, so a state fills those groups only (`wanted`).
        self.wanting: dict[int, tuple[Group, ...]] = {}
        self.distances: dict[KindMix, float] = {}  # other mix -> `distance`

    def indexed(self) -> tuple[tuple[int, float, Kind], ...]:
        if self.generation != REGISTRY.generation:
            generation = REGISTRY.generation
            entries = tuple((REGISTRY.index(k), k[2], k) for k in self.kinds)
            if REGISTRY.generation != generation:  # dropped meanwhile: index them all again, no drop now
                entries = tuple((REGISTRY.index(k, drop=False), k[2], k) for k in self.kinds)
            self.entries = entries
            self.indices = tuple(e[0] for e in entries)
            self.pick = _picker(self.indices)
            self.groups = _groups(entries)
            self.mask = sum(1 << i for i in set(self.indices))
            self.wanting = {}
            self.generation = REGISTRY.generation  # last: a reader that sees it sees the rest
        return self.entries

    def distance(self, other: KindMix) -> float:
        """How far the kinds' weights moved from `other` to this mix: the sum of each kind's change (a
        kind in one mix only counts its whole weight); inf when the two read other waste tables (other
        shares or chances of filling: the kinds' values differ too) or `other` was indexed against a
        dropped registry. Between mixes of the same shares, a state's expected value moves by at most
        this times its free capacity (a kind's value lies between 0 and the free capacity)."""
        if self.generation != REGISTRY.generation:
            self.indexed()
        if other.generation != self.generation or other.waste is not self.waste:
            return float("inf")
        found = self.distances.get(other)
        if found is None:
            weights: dict[int, float] = {}
            for index, weight, _ in self.entries:
                weights[index] = weights.get(index, 0.0) + weight
            for index, weight, _ in other.entries:
                weights[index] = weights.get(index, 0.0) - weight
            if len(self.distances) >= 64:
                self.distances.clear()
            found = self.distances[other] = sum(abs(w) for w in weights.values())
        return found

    def wanted(self, missing: int) -> tuple[Group, ...]:
        """The groups with a kind among `missing` (bits of indices)."""
        found = self.wanting.get(missing)
        if found is None:
            if len(self.wanting) >= 64:
                self.wanting.clear()
            found = self.wanting[missing] = tuple(g for g in self.groups if g[6] & missing)
        return found


def _none(values: array[float]) -> tuple[float, ...]:
    return ()


def _picker(indices: tuple[int, ...]) -> Callable[[array[float]], tuple[float, ...]]:
    """The values at `indices`, as a tuple (itemgetter gives a bare value for one index)."""
    if len(indices) == 1:
        only = indices[0]
        return lambda values: (values[only],)
    return itemgetter(*indices) if indices else _none


def _groups(entries: tuple[tuple[int, float, Kind], ...]) -> tuple[Group, ...]:
    found: dict[tuple[int, int, tuple[str, ...]], list[tuple[int, int, int]]] = {}
    for index, _, (gpus, milli, _, cpu, memory, models) in entries:
        found.setdefault((gpus, milli, models), []).append((index, cpu, memory))
    return tuple(((gpus, milli), models, max(m[1] for m in members), max(m[2] for m in members),
                  tuple(m[0] for m in members), tuple(members), sum(1 << i for i in {m[0] for m in members}))
                 for (gpus, milli, models), members in found.items())


def default_mix() -> tuple[WorkloadShape, ...]:
    """A neutral mix for when nothing has been seen: shared slices, whole cards and multi-GPU tasks."""

    return (
        WorkloadShape(gpus=1, milli=250, weight=2.0),
        WorkloadShape(gpus=1, milli=500, weight=2.0),
        WorkloadShape(gpus=1, milli=MILLI, weight=4.0),
        WorkloadShape(gpus=2, milli=MILLI, weight=0.5),
        WorkloadShape(gpus=4, milli=MILLI, weight=0.25),
        WorkloadShape(gpus=8, milli=MILLI, weight=0.125),
    )


def compiled(mix: tuple[WorkloadShape, ...]) -> KindMix:
    """The mix as the measure takes it (the default mix for an empty one); memoised by value."""
    return compile_mix(mix if mix else default_mix())


@lru_cache(maxsize=64)
def compile_mix(mix: tuple[WorkloadShape, ...]) -> KindMix:
    """The kinds of task that use GPUs, with weights normalised to sum to 1."""
    kept = [s for s in mix if s.gpus > 0 and s.milli > 0 and s.weight > 0]
    total = sum(s.weight for s in kept)
    return KindMix(
        tuple(
            (
                s.gpus,
                min(s.milli, MILLI),
                s.weight / total,
                s.cpu_milli,
                s.memory_mib,
                tuple(m.lower() for m in s.models),
            )
            for s in kept
        )
    )
