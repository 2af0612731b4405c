"""Nodes grouped into equivalence classes so that placement looks at classes, not at every node.

Two nodes are equivalent when everything placement reads is equal: vendor, each GPU's model, memory,
NUMA node and health, the link matrices, CPU and memory capacity, cordon state (the static *shape*)
and what is in use now (the usage). Nodes differ only by name (the tie-break) and GPU UUIDs (handled
per node by the few requests that name UUIDs). A large cluster has few shapes and, because pods come
in few sizes, far fewer distinct usages than nodes.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain, count
from typing import Any

from webhook.core.domain.model import GpuUsage, Node, NodeUsage

from .nodeconstraints import SCHEDULING_EFFECTS, LabelIndex
from .topology import LinkGraph

_MEMO_LIMIT = 4096
MEMO_LIMIT = 1024  # entries per memo table of a state or a shape
_IDLE = GpuUsage()
# Buckets of a shape, by how much room a node has: 0..LEVELS for nodes without an idle GPU (the largest
# free share of a card, in tenths), then LEVELS + n for nodes with n idle GPUs. A pod is only looked for
# in buckets that could hold it.
LEVELS = 10


def share_level(free_memory: int, card: int, free_cores: int) -> int:
    """Tenths of a card free on one GPU (rounded down), by the scarcer of memory and cores."""
    by_memory = free_memory * 1000 // card if card > 0 else 1000
    return max(0, min(by_memory, free_cores * 10, 1000)) // 100


@dataclass(eq=False)
class Shape:
    """The static facts shared by equivalent nodes, with memoised per-request verdicts."""

    number: int
    template: Node  # one node of the shape (scorers read it; its name is not meaningful)
    graph: LinkGraph
    healthy: int  # bitmask of healthy GPUs
    names: tuple[str, ...]  # every node of this shape, sorted
    verdicts: dict[Any, Any] = field(default_factory=dict)  # request signature -> static verdict
    states: dict[NodeUsage, State] = field(default_factory=dict)  # usage -> derived figures

    def state(self, usage: NodeUsage) -> State:
        found = self.states.get(usage)
        if found is None:
            if len(self.states) >= _MEMO_LIMIT:
                self.states.clear()
            found = self.states[usage] = State.of(self, usage)
        return found


class StateMemo:
    """What placement works out for one node state, one table per purpose. A state is shared by every node
    of its shape and usage, so each answer is computed once per class of nodes; each table is bounded
    (`MEMO_LIMIT`, emptied when full)."""

    __slots__ = ("choices", "gpus", "fragmentation", "free_after", "before")

    def __init__(self) -> None:
        # (demand token, allowed GPUs, GPU policy) -> the GPUs to take or why not (fitting.choose_gpus).
        self.choices: dict[tuple[int, int, str], Any] = {}
        # The GPU part of the demand, allowed GPUs, GPU policy -> the GPUs (pods of other CPU and memory).
        self.gpus: dict[tuple[Any, ...], Any] = {}
        # (placement token, allowed GPUs) -> (compiled mix, minus the fragmentation growth and the GPUs under
        # it, the state before, and each option with the state after it): scoring, fragmentation policy.
        self.fragmentation: dict[tuple[int, int], Any] = {}
        # (GPUs, memory, cores, exclusive) -> the free cards after taking them.
        self.free_after: dict[tuple[Any, ...], Any] = {}
        self.before: Any = None  # the state as the fragmentation measure sees it (fragmentation.Measured)


def remember(table: dict[Any, Any], key: Any, value: Any) -> Any:
    """Store `value` in a per-state table, emptying the table first when it is full."""
    if len(table) >= MEMO_LIMIT:
        table.clear()
    table[key] = value
    return value


@dataclass(eq=False)
class State:
    """Figures derived from one (shape, usage) pair, computed once and shared by every such node."""

    shape: Shape
    usage: NodeUsage
    idle: int  # bitmask of healthy GPUs nobody uses
    bucket: int  # see LEVELS
    used_units: float  # GPUs in use, a shared card counting its larger share of memory or cores
    free_cpu: int
    free_memory: int
    memo: StateMemo = field(default_factory=lambda: StateMemo())  # what placement works out for this state

    @staticmethod
    def of(shape: Shape, usage: NodeUsage) -> State:
        node = shape.template
        idle = 0
        used = 0.0
        level = 0
        for i, gpu in enumerate(node.gpus):
            if not gpu.healthy:
                continue
            u = usage.gpus[i]
            if u == _IDLE:
                idle |= 1 << i
            elif u.exclusive:
                used += 1.0
            else:
                by_memory = u.memory_mib / gpu.memory_mib if gpu.memory_mib > 0 else 0.0
                used += min(1.0, max(by_memory, u.cores / 100))
                level = max(level, share_level(gpu.memory_mib - u.memory_mib, gpu.memory_mib, 100 - u.cores))
        bucket = LEVELS + idle.bit_count() if idle else level
        free_cpu = node.cpu_milli - usage.cpu_milli
        return State(shape, usage, idle, bucket, used, free_cpu, node.memory_mib - usage.memory_mib)


@dataclass(frozen=True, eq=False)
class NodeClass:
    """Equivalent nodes in one state; `names` sorted. Replaced, never changed, once shared."""

    state: State
    names: tuple[str, ...]


def normalised(node: Node, usage: NodeUsage | None) -> NodeUsage:
    """Usage with exactly one GpuUsage per GPU of the node (missing entries are idle)."""
    if usage is None:
        return NodeUsage(gpus=(_IDLE,) * len(node.gpus))
    if len(usage.gpus) == len(node.gpus):
        return usage
    gpus = tuple(usage.gpus[: len(node.gpus)]) + (_IDLE,) * max(0, len(node.gpus) - len(usage.gpus))
    return replace(usage, gpus=gpus)


def taken(
    node: Node,
    usage: NodeUsage,
    gpus: tuple[int, ...],
    memory_mib: int,
    cores: int,
    whole_cards: bool,
    cpu_milli: int,
    host_memory_mib: int,
) -> NodeUsage:
    """`usage` after a pod takes `memory_mib` and `cores` on each of `gpus` plus host CPU and memory.

    A card is held exclusively when the pod asks for whole cards or its slice covers all of the card.
    A pod with no GPU takes host resources only and counts as no GPU task.
    """
    cards = list(normalised(node, usage).gpus)
    for i in gpus:
        before = cards[i]
        whole = whole_cards or (cores >= 100 and memory_mib >= node.gpus[i].memory_mib)
        cards[i] = GpuUsage(
            memory_mib=before.memory_mib + memory_mib,
            cores=before.cores + cores,
            tasks=before.tasks + 1,
            exclusive=before.exclusive or whole,
        )
    return NodeUsage(
        gpus=tuple(cards),
        cpu_milli=usage.cpu_milli + cpu_milli,
        memory_mib=usage.memory_mib + host_memory_mib,
        gpu_tasks=usage.gpu_tasks + (1 if gpus else 0),
    )


def _shape_key(node: Node) -> tuple[Any, ...]:
    gpus = tuple((g.model, g.memory_mib, g.numa, g.healthy) for g in node.gpus)
    return (node.vendor, gpus, node.nvlink, node.pcie, node.cpu_milli, node.memory_mib, node.unschedulable,
            node.gpu_units)


@dataclass(eq=False)
class Statics:
    """What never changes between index versions: nodes, shapes, UUID lookup, memoised eligibility."""

    nodes: Mapping[str, Node]
    shapes: tuple[Shape, ...]
    shape_of: dict[str, Shape]
    uuid_node: dict[str, tuple[str, int]]  # GPU UUID -> (node, GPU index)
    eligible: dict[Any, tuple[str, ...]] = field(default_factory=dict)
    tokens: dict[Any, int] = field(default_factory=dict)  # request signature -> memo key
    counter: Iterator[int] = field(default_factory=count)
    # Node constraints (labels and taints are not part of a shape): whether any node has a taint that
    # keeps pods off, the label index (built on first need) and the reach of each set of constraints.
    tainted: bool = False
    labels: LabelIndex | None = None
    reach: dict[Any, Any] = field(default_factory=dict)
    # Multi-pod groups' domain tables (group_place.table_of): levels -> (eligible names, table), newest last.
    tables: dict[tuple[str, ...], list[tuple[tuple[str, ...], Any]]] = field(default_factory=dict)
    # The required node-affinity term the mutation writes (admission/mutate.py `_required`), by the
    # eligible tuple's identity and the names limit: (that tuple, the term).
    required: dict[tuple[int, int], tuple[tuple[str, ...], Any]] = field(default_factory=dict)

    def label_index(self) -> LabelIndex:
        found = self.labels
        if found is None:
            found = self.labels = LabelIndex(self.nodes)
        return found

    def token(self, key: Any) -> int:
        """An integer standing for a request signature: cheap to hash in the per-state memos.

        Never reused (a forgotten signature gets a new number), and safe under threads: `next` on a
        counter and `setdefault` are atomic.
        """
        found = self.tokens.get(key)
        if found is None:
            if len(self.tokens) >= _MEMO_LIMIT * 16:
                self.tokens.clear()
            found = self.tokens.setdefault(key, next(self.counter))
        return found


class NodeIndex:
    """Nodes grouped so that placement is sublinear in cluster size.

    `build` once from a snapshot; `updated` returns a new index sharing structure (copy-on-write, for the
    webhook's snapshots); `apply` changes this index in place (for the simulator).
    """

    __slots__ = ("statics", "_usage_of", "_buckets", "_counts", "_owned")

    def __init__(
        self,
        statics: Statics,
        usage_of: dict[str, NodeUsage],
        buckets: dict[int, list[dict[NodeUsage, NodeClass]]],
        counts: dict[int, list[int]],
        owned: bool,
    ) -> None:
        self.statics = statics
        self._usage_of = usage_of
        # Per shape number, per count of idle GPUs: usage -> class, and how many nodes that is.
        self._buckets = buckets
        self._counts = counts
        self._owned = owned  # False while containers may be shared with another index

    @classmethod
    def build(cls, nodes: Mapping[str, Node], usage: Mapping[str, NodeUsage]) -> NodeIndex:
        by_key: dict[tuple[Any, ...], list[str]] = {}
        for name in sorted(nodes):
            by_key.setdefault(_shape_key(nodes[name]), []).append(name)
        shapes: list[Shape] = []
        shape_of: dict[str, Shape] = {}
        uuid_node: dict[str, tuple[str, int]] = {}
        for number, names in enumerate(by_key.values()):
            template = nodes[names[0]]
            healthy = sum(1 << i for i, g in enumerate(template.gpus) if g.healthy)
            shape = Shape(number, template, LinkGraph.of_node(template), healthy, tuple(names))
            shapes.append(shape)
            for name in names:
                shape_of[name] = shape
                for i, gpu in enumerate(nodes[name].gpus):
                    if gpu.uuid:
                        uuid_node[gpu.uuid] = (name, i)
        tainted = any(t.effect in SCHEDULING_EFFECTS for node in nodes.values() for t in node.taints)
        statics = Statics(nodes, tuple(shapes), shape_of, uuid_node, tainted=tainted)
        members: dict[tuple[int, NodeUsage], list[str]] = {}
        for name in sorted(nodes):
            shape = shape_of[name]
            members.setdefault((shape.number, normalised(nodes[name], usage.get(name))), []).append(name)
        buckets: dict[int, list[dict[NodeUsage, NodeClass]]] = {
            s.number: [{} for _ in range(LEVELS + len(s.template.gpus) + 1)] for s in shapes
        }
        counts = {s.number: [0] * (LEVELS + len(s.template.gpus) + 1) for s in shapes}
        usage_of: dict[str, NodeUsage] = {}
        for (number, used), names in members.items():
            state = shapes[number].state(used)
            buckets[number][state.bucket][used] = NodeClass(state, tuple(names))
            counts[number][state.bucket] += len(names)
            for name in names:
                usage_of[name] = used
        return cls(statics, usage_of, buckets, counts, owned=True)

    # -- reading ---------------------------------------------------------------------------------

    @property
    def nodes(self) -> Mapping[str, Node]:
        return self.statics.nodes

    def usage(self, node: str) -> NodeUsage:
        return self._usage_of[node]

    def __len__(self) -> int:
        return len(self._usage_of)

    def classes(self, shape: Shape, first_bucket: int = 0) -> Iterator[NodeClass]:
        """The classes of a shape in buckets from `first_bucket` on (see LEVELS)."""
        return chain.from_iterable(map(dict.values, self._buckets[shape.number][first_bucket:]))  # in C

    def count_below(self, shape: Shape, first_bucket: int) -> int:
        """How many nodes of a shape are in buckets before `first_bucket`."""
        return sum(self._counts[shape.number][:first_bucket])

    def class_count(self) -> int:
        return sum(len(b) for buckets in self._buckets.values() for b in buckets)

    # -- changing --------------------------------------------------------------------------------

    def updated(self, changes: Mapping[str, NodeUsage]) -> NodeIndex:
        """A new index with these nodes' usage replaced; this one is left as it was."""
        self._owned = False
        copy = NodeIndex(self.statics, dict(self._usage_of), dict(self._buckets), dict(self._counts), owned=False)
        copied: set[tuple[int, int]] = set()
        shapes_copied: set[int] = set()
        for name, used in changes.items():
            copy._move(name, used, copied, shapes_copied)
        return copy

    def apply(self, node: str, usage: NodeUsage) -> None:
        """Replace one node's usage in place."""
        if not self._owned:
            self._usage_of = dict(self._usage_of)
            self._buckets = {n: [dict(b) for b in buckets] for n, buckets in self._buckets.items()}
            self._counts = {n: list(c) for n, c in self._counts.items()}
            self._owned = True
        self._move(node, usage, None, None)

    def _bucket(
        self, number: int, at: int, copied: set[tuple[int, int]] | None, shapes_copied: set[int] | None
    ) -> dict[NodeUsage, NodeClass]:
        """The bucket to change, copied first when it may be shared with another index."""
        if copied is None or shapes_copied is None or (number, at) in copied:
            return self._buckets[number][at]
        if number not in shapes_copied:
            self._buckets[number] = list(self._buckets[number])
            self._counts[number] = list(self._counts[number])
            shapes_copied.add(number)
        bucket = self._buckets[number][at] = dict(self._buckets[number][at])
        copied.add((number, at))
        return bucket

    def _move(
        self, name: str, usage: NodeUsage, copied: set[tuple[int, int]] | None, shapes_copied: set[int] | None
    ) -> None:
        before = self._usage_of.get(name)
        if before is None:
            raise KeyError(f"unknown node {name!r}")
        shape = self.statics.shape_of[name]
        used = normalised(shape.template, usage)
        if before == used:
            return
        old_state = shape.state(before)
        bucket = self._bucket(shape.number, old_state.bucket, copied, shapes_copied)
        old = bucket[before]
        if len(old.names) == 1:
            del bucket[before]
        else:
            at = bisect_left(old.names, name)
            bucket[before] = NodeClass(old.state, old.names[:at] + old.names[at + 1 :])
        self._counts[shape.number][old_state.bucket] -= 1
        self._usage_of[name] = used
        state = shape.state(used)
        bucket = self._bucket(shape.number, state.bucket, copied, shapes_copied)
        existing = bucket.get(used)
        if existing is None:
            joined = NodeClass(state, (name,))
        else:
            merged = list(existing.names)
            insort(merged, name)
            joined = NodeClass(existing.state, tuple(merged))
        bucket[used] = joined
        self._counts[shape.number][state.bucket] += 1
