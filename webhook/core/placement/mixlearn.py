"""The workload mix, learned online from what the cluster shows: one learner for the webhook, `check` and the
simulator.

The fragmentation policy weighs a node's free capacity by the kinds of GPU pod likely to come next. Those
kinds are read from the GPU pods the cluster holds (running, pending, and admitted but not yet seen by the
watch): a histogram of request shapes (GPUs, thousandths of a card each, CPU, host memory, allowed models).
The mix is a pure function of that histogram and the nodes, so replicas that watch the same cluster
derive the same mix, and a restart loses nothing the cluster still shows.

Cost: the histogram is kept by its owner as pods come and go (`Histogram.add`, O(1)) and published with
the snapshot (`Observed`, copied only when it changed). The mix is derived once per published histogram
(`learned_mix`, memoised by identity; O(shapes)), from its quantised form (`signature`), and is the very
same tuple while that does not change; never per admission.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from operator import itemgetter

from webhook.core.domain.model import Node, Snapshot
from webhook.core.domain.request import PodRequest
from webhook.core.domain.shapes import EMPTY, MILLI, Observed, Shape, shape_of, slice_milli
from webhook.core.policy.model import Policy

from .context import HashedTuple, WorkloadShape
from .fragmentation import default_mix

# A node as far as hosting goes, with how many such nodes: ((model, healthy GPUs, CPU, memory), count).
Hosts = tuple[tuple[tuple[str, int, int, int], int], ...]
Signature = tuple[tuple[Shape, int], ...]

# Quantisation: a shape's weight (its count over the capacity that could host it, as a share of all
# shapes') on a log scale, STEPS per halving (1: the share is known within a factor of two); shapes
# under DROP of the weight are left out. Coarse on purpose: a placement decision hardly moves with a
# weight a few tens of per cent off, and each new mix has the scorer weigh the node classes again, so the
# mix changes when the workload has, not with every pod.
STEPS = 1
DROP = 1 / 256
MAX_SHAPES = 48  # a bound on the kinds per mix (each costs time per node state)


class Histogram:
    """The running histogram its owner keeps as pods come and go (the watch cache, the simulator).
    `view()` hands out an `Observed`, copied only after a count changed."""

    __slots__ = ("counts", "_view")

    def __init__(self) -> None:
        self.counts: dict[Shape, int] = {}
        self._view: Observed | None = EMPTY

    def add(self, shape: Shape | None, sign: int = 1) -> bool:
        """Count one pod in (sign 1) or out (-1); False when there is nothing to count."""
        if shape is None:
            return False
        count = self.counts.get(shape, 0) + sign
        if count > 0:
            self.counts[shape] = count
        else:
            self.counts.pop(shape, None)
        self._view = None
        return True

    def view(self) -> Observed:
        if self._view is None:
            self._view = Observed(dict(self.counts))
        return self._view


def request_shape(request: PodRequest) -> Shape | None:
    """The shape of a pod's request, as the webhook and the simulator see it before placing it."""
    if request.mig:
        return None
    milli = slice_milli(request.memory_mib, request.memory_pct, request.cores)
    return shape_of(request.gpus, milli, request.cpu_milli, request.memory_mib_host, request.models_include)


def hosts_of(nodes: Iterable[Node]) -> Hosts:
    """The schedulable nodes as far as hosting goes, grouped (hashable, small)."""
    found: dict[tuple[str, int, int, int], int] = {}
    for node in nodes:
        if node.unschedulable:
            continue
        key = (node.gpu_model.lower(), sum(1 for g in node.gpus if g.healthy), node.cpu_milli, node.memory_mib)
        found[key] = found.get(key, 0) + 1
    return tuple(sorted(found.items()))


@lru_cache(maxsize=16)
def _supplies(hosts: Hosts) -> dict[Shape, float]:
    """Supply per shape for these nodes, filled as shapes come (one hash of `hosts` per histogram)."""
    return {}


def supply(hosts: Hosts, shape: Shape) -> float:
    """GPU capacity (GPUs) that tasks of this shape could take on an empty cluster.

    Per node, as many such tasks as its cards, CPU and memory allow, times what each takes of the cards:
    a node whose CPU runs out after one task supplies that task's GPUs, not all of its cards.
    """
    gpus, milli, cpu, memory, models = shape
    total = 0.0
    for (model, healthy, node_cpu, node_memory), count in hosts:
        if healthy < gpus or (models and not any(m in model for m in models)):
            continue
        if (node_cpu and node_cpu < cpu) or (node_memory and node_memory < memory):
            continue
        tasks = healthy * (MILLI // milli) if gpus == 1 else healthy // gpus
        if cpu and node_cpu:
            tasks = min(tasks, node_cpu // cpu)
        if memory and node_memory:
            tasks = min(tasks, node_memory // memory)
        total += tasks * gpus * milli / MILLI * count
    return total


def signature(counts: Mapping[Shape, int], hosts: Hosts) -> Signature:
    """The quantised histogram: each shape's weight - its count over the GPU capacity such tasks could
    take on an empty cluster (a kind only a few nodes can host counts for more on those nodes) - as a
    share of all shapes' weight, in STEPS per halving; shapes under DROP, and those no node can host, out."""
    weights: list[tuple[Shape, float]] = []
    total = 0.0
    known = _supplies(hosts)
    for shape, count in counts.items():
        capacity = known.get(shape)
        if capacity is None:
            capacity = known[shape] = supply(hosts, shape) if hosts else 1.0
        if capacity > 0 and count > 0:
            weight = count / capacity
            weights.append((shape, weight))
            total += weight
    if not total:
        return ()
    # Each kept share's level: STEPS per halving, and half as many below RARE (the rare shapes' shares
    # move the most from pod to pod, and each matters little on its own). Once per decision: inline.
    cut = DROP * total
    floor, log2 = math.floor, math.log2
    kept: list[tuple[Shape, int]] = []
    for shape, weight in weights:
        if weight >= cut:
            share = weight / total
            level = floor(STEPS * log2(share))
            if share < RARE:
                level -= level % (2 * STEPS)
            kept.append((shape, level))
    kept.sort(key=_first)  # shapes are unique: by shape alone is the pairs' order
    return tuple(kept)


_first = itemgetter(0)
RARE = 1 / 32  # shares under this move in steps of two halvings


@lru_cache(maxsize=256)
def mix_of_signature(quantised: Signature) -> tuple[WorkloadShape, ...]:
    """The mix of a quantised histogram (each step's geometric middle as the weight); empty: nothing
    learned yet (the policy then uses the default mix)."""

    merged: dict[Shape, float] = {}
    for shape, step in quantised:
        merged[shape] = 2.0 ** ((step + 0.5) / STEPS)
    ranked = sorted(merged.items(), key=lambda sw: (-sw[1], sw[0]))[:MAX_SHAPES]
    total = sum(weight for _, weight in ranked)
    return Mix(WorkloadShape(gpus, milli, weight / total, cpu, memory, models)
               for (gpus, milli, cpu, memory, models), weight in ranked)


class Mix(HashedTuple["WorkloadShape"]):
    """A learned mix, hashed once (the placement memos hash the mix once per decision; four dozen
    dataclass hashes each time would show in the admission time)."""


def mix_of(counts: Mapping[Shape, int], hosts: Hosts) -> tuple[WorkloadShape, ...]:
    """The learned mix of a histogram over these nodes: the one function the webhook, `check` and the
    simulator call. The same quantised histogram gives the very same tuple (memoised)."""
    return mix_of_signature(signature(counts, hosts))


class Learner(Histogram):
    """A histogram kept by one owner pod by pod (the simulator), with its mix: after every `add`, `mix()`
    is `mix_of(counts, hosts)`, but the quantisation is done again only when a shape's level could have
    moved. From one full pass it keeps the range of the weights' total within which no kept or dropped
    shape changes level (the range narrows as shapes' counts change and is never widened until the
    next pass, so a reused answer is always the full pass's)."""

    __slots__ = ("hosts", "_supplies", "_weights", "_total", "_low", "_high", "_mix")

    def __init__(self, hosts: Hosts) -> None:
        super().__init__()
        self.hosts = hosts
        self._supplies = _supplies(hosts)
        self._weights: dict[Shape, float] = {}
        self._total = 0.0
        self._low, self._high = 1.0, 0.0  # the total's range (empty: the next `mix()` is a full pass)
        self._mix: tuple[WorkloadShape, ...] = ()

    def add(self, shape: Shape | None, sign: int = 1) -> bool:
        if shape is None or not super().add(shape, sign):
            return False
        count = self.counts.get(shape, 0)
        capacity = self._supplies.get(shape)
        if capacity is None:
            capacity = self._supplies[shape] = supply(self.hosts, shape) if self.hosts else 1.0
        if capacity <= 0:
            return True  # no node can host it: never in the mix, never in the total
        old = self._weights.get(shape, 0.0)
        weight = count / capacity if count > 0 else 0.0
        before = self._total
        self._total = after = before + weight - old
        low, high, standing = _band(weight, after)
        if not self._low < before <= self._high or standing != _band(old, before)[2]:
            # Out of the range already, or this shape's level moved: the next `mix()` quantises again.
            self._low, self._high = 1.0, 0.0
        else:
            self._low, self._high = max(self._low, low), min(self._high, high)
        if weight > 0:
            self._weights[shape] = weight
        else:
            self._weights.pop(shape, None)
        return True

    def mix(self) -> tuple[WorkloadShape, ...]:
        total = self._total
        if not self._low < total <= self._high:
            self._mix = mix_of(self.counts, self.hosts)
            self._total = total = sum(self._weights.values())
            self._low, self._high = 0.0, float("inf")
            for weight in self._weights.values():
                low, high, _ = _band(weight, total)
                self._low, self._high = max(self._low, low), min(self._high, high)
        return self._mix


# How far inside a level's edges the total must stay for the level to be taken as unchanged: far above
# the rounding of a sum and a logarithm, so an answer is reused only where the full pass would agree.
_MARGIN = 1e-9


def _band(weight: float, total: float) -> tuple[float, float, tuple[bool, int]]:
    """The range of totals (low, high] within which a shape of this weight keeps its standing at `total`
    (kept or dropped, and its level: `signature`), shrunk by _MARGIN; and that standing."""
    if weight <= 0:
        return 0.0, float("inf"), (False, 0)  # not counted: out whatever the total
    dropped_from = weight / DROP  # kept while the total is at most this
    if weight < DROP * total:
        return dropped_from * (1 + _MARGIN), float("inf"), (False, 0)
    share = weight / total
    level = math.floor(STEPS * math.log2(share))
    if share < RARE:
        level -= level % (2 * STEPS)
        top = min(2.0 ** ((level + 2 * STEPS) / STEPS), RARE)  # the share's range at this level
    else:
        top = 2.0 ** ((level + 1) / STEPS)
    bottom = 2.0 ** (level / STEPS)
    if share >= RARE:
        bottom = max(bottom, RARE)
    # share in [bottom, top)  <=>  total in (weight / top, weight / bottom]
    return (weight / top * (1 + _MARGIN), min(weight / bottom, dropped_from) * (1 - _MARGIN), (True, level))


# The published objects met last, told by identity (held here, newest last; a plain dict of nodes and a
# slotted histogram have no room for a field): hosts per node mapping, and the mix per (observed, nodes).
# Both bounded. Without them an admission would group every node again (100 us per 100 nodes).
_HOSTS: list[tuple[Mapping[str, Node], Hosts]] = []
_MIXES: list[tuple[Observed, Mapping[str, Node], tuple[WorkloadShape, ...]]] = []


def hosts_for(nodes: Mapping[str, Node]) -> Hosts:
    """`hosts_of` memoised per node mapping (a snapshot's is shared until a node changes)."""
    for seen, hosts in reversed(_HOSTS):
        if seen is nodes:
            return hosts
    hosts = hosts_of(nodes.values())
    if len(_HOSTS) >= 16:
        _HOSTS.clear()
    _HOSTS.append((nodes, hosts))
    return hosts


def learned_mix(observed: Observed | None, nodes: Mapping[str, Node]) -> tuple[WorkloadShape, ...]:
    """The mix a snapshot's pods teach: a look-up or two while neither has changed."""
    if observed is None or not observed.counts:
        return ()
    for seen, seen_nodes, mix in reversed(_MIXES):
        if seen is observed and seen_nodes is nodes:
            return mix
    mix = mix_of(observed.counts, hosts_for(nodes))
    if len(_MIXES) >= 64:
        _MIXES.clear()
    _MIXES.append((observed, nodes, mix))
    return mix


def mix_in_use(policy: Policy, snapshot: Snapshot) -> tuple[str, tuple[WorkloadShape, ...]]:
    """The fragmentation policy's mix for this policy and snapshot, weights summing to 1, and where it
    comes from: "learned", "fixed" (the policy's list), or "default" (asked for, or nothing learned yet)."""

    if policy.workload_mix_source == "fixed":
        source, mix = "fixed", tuple(WorkloadShape(e.gpus, e.milli, e.weight) for e in policy.workload_mix)
    elif policy.workload_mix_source == "learn" and (learned := learned_mix(snapshot.observed, snapshot.nodes)):
        source, mix = "learned", learned
    else:
        source, mix = "default", default_mix()
    total = sum(s.weight for s in mix if s.weight > 0)
    return source, tuple(WorkloadShape(s.gpus, s.milli, s.weight / total, s.cpu_milli, s.memory_mib, s.models)
                         for s in mix if s.weight > 0)
