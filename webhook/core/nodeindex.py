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
from typing import Any

from .model import GpuUsage, Node, NodeUsage
from .topology import LinkGraph

_MEMO_LIMIT = 4096
_IDLE = GpuUsage()


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


@dataclass(eq=False)
class State:
    """Figures derived from one (shape, usage) pair, computed once and shared by every such node."""

    shape: Shape
    usage: NodeUsage
    idle: int  # bitmask of healthy GPUs nobody uses
    used_units: float  # GPUs in use, a shared card counting its larger share of memory or cores
    free_cpu: int
    free_memory: int
    memo: dict[Any, Any] = field(default_factory=dict)  # request signature -> dynamic verdict

    @staticmethod
    def of(shape: Shape, usage: NodeUsage) -> State:
        node = shape.template
        idle = 0
        used = 0.0
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
        return State(shape, usage, idle, used, node.cpu_milli - usage.cpu_milli, node.memory_mib - usage.memory_mib)

    @property
    def idle_count(self) -> int:
        return self.idle.bit_count()


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


def _shape_key(node: Node) -> tuple[Any, ...]:
    gpus = tuple((g.model, g.memory_mib, g.numa, g.healthy) for g in node.gpus)
    return (node.vendor, gpus, node.nvlink, node.pcie, node.cpu_milli, node.memory_mib, node.unschedulable)


@dataclass(eq=False)
class Statics:
    """What never changes between index versions: nodes, shapes, UUID lookup, memoised eligibility."""

    nodes: Mapping[str, Node]
    shapes: tuple[Shape, ...]
    shape_of: dict[str, Shape]
    uuid_node: dict[str, tuple[str, int]]  # GPU UUID -> (node, GPU index)
    eligible: dict[Any, tuple[str, ...]] = field(default_factory=dict)


class NodeIndex:
    """Nodes grouped so that placement is sublinear in cluster size.

    `build` once from a snapshot; `updated` returns a new index sharing structure (copy-on-write, for the
    webhook's snapshots); `apply` changes this index in place (for the simulator).
    """

    __slots__ = ("statics", "_usage_of", "_buckets", "_owned")

    def __init__(
        self,
        statics: Statics,
        usage_of: dict[str, NodeUsage],
        buckets: dict[int, list[dict[NodeUsage, NodeClass]]],
        owned: bool,
    ) -> None:
        self.statics = statics
        self._usage_of = usage_of
        # Per shape number, per count of idle GPUs: usage -> class.
        self._buckets = buckets
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
        statics = Statics(nodes, tuple(shapes), shape_of, uuid_node)
        members: dict[tuple[int, NodeUsage], list[str]] = {}
        for name in sorted(nodes):
            shape = shape_of[name]
            members.setdefault((shape.number, normalised(nodes[name], usage.get(name))), []).append(name)
        buckets: dict[int, list[dict[NodeUsage, NodeClass]]] = {
            s.number: [{} for _ in range(len(s.template.gpus) + 1)] for s in shapes
        }
        usage_of: dict[str, NodeUsage] = {}
        for (number, used), names in members.items():
            state = shapes[number].state(used)
            buckets[number][state.idle_count][used] = NodeClass(state, tuple(names))
            for name in names:
                usage_of[name] = used
        return cls(statics, usage_of, buckets, owned=True)

    # -- reading ---------------------------------------------------------------------------------

    @property
    def nodes(self) -> Mapping[str, Node]:
        return self.statics.nodes

    def usage(self, node: str) -> NodeUsage:
        return self._usage_of[node]

    def __len__(self) -> int:
        return len(self._usage_of)

    def classes(self, shape: Shape, min_idle: int = 0) -> Iterator[NodeClass]:
        """The classes of a shape having at least `min_idle` idle GPUs."""
        for bucket in self._buckets[shape.number][min_idle:]:
            yield from bucket.values()

    def bucket(self, shape: Shape, idle: int) -> Iterator[NodeClass]:
        """The classes of a shape having exactly `idle` idle GPUs."""
        return iter(self._buckets[shape.number][idle].values())

    def class_count(self) -> int:
        return sum(len(b) for buckets in self._buckets.values() for b in buckets)

    # -- changing --------------------------------------------------------------------------------

    def updated(self, changes: Mapping[str, NodeUsage]) -> NodeIndex:
        """A new index with these nodes' usage replaced; this one is left as it was."""
        self._owned = False
        copy = NodeIndex(self.statics, dict(self._usage_of), dict(self._buckets), owned=False)
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
            self._owned = True
        self._move(node, usage, None, None)

    def _bucket(
        self, number: int, idle: int, copied: set[tuple[int, int]] | None, shapes_copied: set[int] | None
    ) -> dict[NodeUsage, NodeClass]:
        """The bucket to change, copied first when it may be shared with another index."""
        if copied is None or shapes_copied is None or (number, idle) in copied:
            return self._buckets[number][idle]
        if number not in shapes_copied:
            self._buckets[number] = list(self._buckets[number])
            shapes_copied.add(number)
        bucket = self._buckets[number][idle] = dict(self._buckets[number][idle])
        copied.add((number, idle))
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
        bucket = self._bucket(shape.number, old_state.idle_count, copied, shapes_copied)
        old = bucket[before]
        if len(old.names) == 1:
            del bucket[before]
        else:
            at = bisect_left(old.names, name)
            bucket[before] = NodeClass(old.state, old.names[:at] + old.names[at + 1 :])
        self._usage_of[name] = used
        state = shape.state(used)
        bucket = self._bucket(shape.number, state.idle_count, copied, shapes_copied)
        existing = bucket.get(used)
        if existing is None:
            joined = NodeClass(state, (name,))
        else:
            merged = list(existing.names)
            insort(merged, name)
            joined = NodeClass(existing.state, tuple(merged))
        bucket[used] = joined
