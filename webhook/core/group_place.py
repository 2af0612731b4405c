"""Where a multi-pod group lives: the topology domain its first pod chooses, and what later pods follow.

Levels are node labels naming domains, innermost first (`groupTopology.levels`; a level no eligible node
carries is skipped). The first pod of a group (no record in `Snapshot.groups`) takes the innermost level
where some domain could ever hold the whole group, and there the domain that holds it now with the
least left over (best fit on free GPUs, then the name); an open-ended group takes the domain with the
most room for pods like it. "Could hold" counts pods like this one on the domain's nodes that the pod
may use (its eligible set), each on one node, less the GPUs other groups' records still promise there.
Later pods follow the record. `required` makes the domain a node affinity requirement (and the record
seals it); `preferred` only prefers it, and splits the group with a warning where no domain has room.

Pure, and per admission cheap: the domain table (node -> domain per level, capacity per pod size) is
built once per eligible set and node set; each first pod then walks only the node classes with idle
GPUs. Pods of another scheduler are recorded in their group but get no domain: that scheduler places
them.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .groups import GROUP_TOPOLOGY_ANNOTATION, GroupRecord, GroupRef, group_of
from .model import Placement, PodRequest, Snapshot
from .nodeindex import LEVELS, NodeIndex, Statics
from .placement import PlacementContext, index_of, place
from .policy import GROUP_MODES, Policy
from .vendors import mapping_of

DEFAULT_SCHEDULERS = ("", "default-scheduler")
REQUIRED, PREFERRED, NONE = GROUP_MODES


class Room(NamedTuple):
    """One domain as a group's first pod sees it, in pods like that pod (each on one node)."""

    level: str
    value: str
    capacity: int  # pods its eligible nodes hold when empty
    free: int  # pods they hold now, less what other groups' records promise there
    free_gpus: int  # idle GPUs now on nodes with room for such a pod, less those promises (best fit)


class Choice(NamedTuple):
    level: str
    value: str
    now: bool  # room now; else the group waits for capacity there


@dataclass(frozen=True)
class GroupPlan:
    """What admission does for a grouped pod. `requirement`: `level In [value]`, or None (no domain)."""

    ref: GroupRef
    mode: str
    level: str = ""
    value: str = ""
    warnings: tuple[str, ...] = ()
    placement_hint: Placement | None = field(default=None, compare=False, repr=False)  # unrestricted

    @property
    def domain(self) -> str:
        return f"{self.level}={self.value}" if self.level else ""

    @property
    def requirement(self) -> dict[str, Any] | None:
        if not self.level:
            return None
        return {"key": self.level, "operator": "In", "values": [self.value]}

    @property
    def required(self) -> bool:
        return self.mode == REQUIRED and bool(self.level)


class Refusal(NamedTuple):
    code: int
    reason: str
    message: str


def mode_of(pod: Mapping[str, Any], namespace: str, policy: Policy) -> str:
    """The pod's `gpu-admission.io/group-topology`, else its namespace's rule, else the policy's."""
    raw = mapping_of(mapping_of(pod.get("metadata")).get("annotations")).get(GROUP_TOPOLOGY_ANNOTATION)
    if raw is None:
        return policy.group_topology_for(namespace)
    if raw not in GROUP_MODES:
        raise ValueError(f"metadata.annotations[{GROUP_TOPOLOGY_ANNOTATION}]: expected one of "
                         f"{', '.join(GROUP_MODES)}, got {raw!r}")
    return str(raw)


# -- the domain table, once per (node set, eligible set, levels) ----------------------------------------


@dataclass(eq=False)
class Table:
    levels: tuple[str, ...]  # present among the eligible nodes, innermost first
    where: dict[str, tuple[str | None, ...]]  # eligible node -> its domain at each level
    healthy: dict[str, int]  # eligible node -> healthy GPUs
    capacity: dict[int, list[dict[str, int]]] = field(default_factory=dict)  # GPUs per pod -> per level
    # A node class's names -> how many of them lie in each domain, per level. Classes are shared between
    # index versions (copy-on-write), so most are counted once, not once per admission.
    counted: dict[int, tuple[tuple[str, ...], list[list[tuple[str, int]]]]] = field(default_factory=dict)

    def count(self, names: tuple[str, ...]) -> list[list[tuple[str, int]]]:
        hit = self.counted.get(id(names))
        if hit is not None and hit[0] is names:
            return hit[1]
        per_level: list[dict[str, int]] = [{} for _ in self.levels]
        for name in names:
            domains = self.where.get(name)
            if domains is not None:
                for i, value in enumerate(domains):
                    if value is not None:
                        per_level[i][value] = per_level[i].get(value, 0) + 1
        found = [list(d.items()) for d in per_level]
        if len(self.counted) >= 8192:
            self.counted.clear()
        self.counted[id(names)] = (names, found)
        return found

    def capacity_for(self, gpus: int) -> list[dict[str, int]]:
        found = self.capacity.get(gpus)
        if found is None:
            found = [{} for _ in self.levels]
            for name, domains in self.where.items():
                pods = self.healthy[name] // gpus
                for i, value in enumerate(domains):
                    if value is not None:
                        found[i][value] = found[i].get(value, 0) + pods
            self.capacity[gpus] = found
        return found


_TABLES: weakref.WeakKeyDictionary[Statics, dict[Any, tuple[tuple[str, ...], Table]]] = weakref.WeakKeyDictionary()


def table_of(statics: Statics, eligible: tuple[str, ...], levels: tuple[str, ...]) -> Table:
    """Memoised per node set by the identity of the eligible tuple (placement memoises those)."""
    memo = _TABLES.get(statics)
    if memo is None:
        memo = _TABLES.setdefault(statics, {})
    hit = memo.get((id(eligible), levels))
    if hit is not None and hit[0] is eligible:
        return hit[1]
    nodes = statics.nodes
    present = tuple(lv for lv in levels if any(lv in nodes[n].labels for n in eligible if n in nodes))
    where: dict[str, tuple[str | None, ...]] = {}
    healthy: dict[str, int] = {}
    for name in eligible:
        node = nodes.get(name)
        if node is None:
            continue
        domains = tuple(node.labels.get(lv) for lv in present)
        if any(d is not None for d in domains):
            where[name] = domains
            healthy[name] = sum(1 for g in node.gpus if g.healthy)
    table = Table(present, where, healthy)
    if len(memo) >= 64:
        memo.clear()
    memo[(id(eligible), levels)] = (eligible, table)
    return table


def rooms(table: Table, index: NodeIndex, gpus: int, records: Mapping[str, Any]) -> list[list[Room]]:
    """Per present level, every domain's room for pods of `gpus` GPUs now. Walks only the node classes
    with at least `gpus` idle GPUs (the index's buckets from LEVELS + gpus), not every node."""
    gpus = max(gpus, 1)
    capacity = table.capacity_for(gpus)
    free = [dict.fromkeys(c, 0) for c in capacity]
    idle_gpus = [dict.fromkeys(c, 0) for c in capacity]
    for shape in index.statics.shapes:
        for node_class in index.classes(shape, LEVELS + gpus):
            idle = node_class.state.idle.bit_count()
            pods = idle // gpus
            for i, counts in enumerate(table.count(node_class.names)):
                level_free, level_idle = free[i], idle_gpus[i]
                for value, nodes in counts:
                    level_free[value] += pods * nodes
                    level_idle[value] += idle * nodes
    promised: dict[tuple[str, str], int] = {}
    for record in records.values():
        if isinstance(record, GroupRecord) and record.promised_gpus:
            at = (record.level, record.domain)
            promised[at] = promised.get(at, 0) + record.promised_gpus
    out: list[list[Room]] = []
    for i, level in enumerate(table.levels):
        level_rooms = []
        for value in sorted(capacity[i]):
            held = promised.get((level, value), 0)
            level_rooms.append(Room(level, value, capacity[i][value], max(free[i][value] - -(-held // gpus), 0),
                                    idle_gpus[i][value] - held))
        out.append(level_rooms)
    return out


def choose(levels: list[list[Room]], pods: int, open_ended: bool) -> Choice | None:
    """The innermost level where some domain could ever hold `pods`; there, the best domain with room now
    (best fit: fewest GPUs left free, then the name; open-ended: the most room, then the name), else the
    one with most room now and then most capacity (the group waits). None: no domain ever could."""
    for level_rooms in levels:
        ever = [r for r in level_rooms if r.capacity >= pods]
        if not ever:
            continue
        now = [r for r in ever if r.free >= pods]
        if now:
            if open_ended:
                best = min(now, key=lambda r: (-r.free, -r.free_gpus, r.value))
            else:
                best = min(now, key=lambda r: (r.free_gpus, r.free, r.value))
            return Choice(best.level, best.value, True)
        wait = min(ever, key=lambda r: (-r.free, -r.capacity, r.value))
        return Choice(wait.level, wait.value, False)
    return None


# -- admission ------------------------------------------------------------------------------------------


def plan(request: PodRequest, snapshot: Snapshot, policy: Policy, ctx: PlacementContext,
         when_full: str) -> GroupPlan | Refusal | None:
    """The group step of a pod's mutation: None for a pod of no group."""
    try:
        ref = group_of(request.raw, request.namespace)
        if ref is None:
            return None
        mode = mode_of(request.raw, request.namespace, policy)
    except ValueError as err:
        return Refusal(422, "invalid-group", str(err))
    if mode == NONE or request.scheduler_name not in DEFAULT_SCHEDULERS:
        return GroupPlan(ref, mode)
    record = snapshot.groups.get(ref.key)
    if isinstance(record, GroupRecord):
        return GroupPlan(ref, mode, record.level, record.domain)
    return _first(request, ref, mode, snapshot, policy, ctx, when_full)


def _first(request: PodRequest, ref: GroupRef, mode: str, snapshot: Snapshot, policy: Policy,
           ctx: PlacementContext, when_full: str) -> GroupPlan | Refusal:
    index = index_of(snapshot)
    whole = place(request, index, ctx)
    table = table_of(index.statics, whole.eligible, policy.group_levels)
    if not whole.eligible or not table.levels:  # unsatisfiable (admission says why), or no domains at all
        return GroupPlan(ref, mode, placement_hint=whole)
    gpus = max(request.gpus, 1)
    pods = ref.size if ref.size is not None else ref.minimum
    levels = rooms(table, index, gpus, snapshot.groups)
    choice = choose(levels, pods, ref.size is None)
    need = f"{'at least ' if ref.size is None else ''}{pods * gpus} GPUs ({pods} pods x {gpus})"
    if choice is None:
        largest = max((r.capacity for r in levels[-1]), default=0) * gpus
        message = f"group {ref.key} needs {need} in one {table.levels[-1]}; the largest has {largest}"
        if mode == REQUIRED:
            return Refusal(422, "group-too-large", message)
        return GroupPlan(ref, mode, warnings=(message + ": placed split",), placement_hint=whole)
    if choice.now:
        return GroupPlan(ref, mode, choice.level, choice.value, placement_hint=whole)
    where = f"{choice.level}={choice.value}"
    if mode == PREFERRED:
        return GroupPlan(ref, mode, warnings=(f"group {ref.key}: no {choice.level} has room for {need} now: "
                                              "placed split",), placement_hint=whole)
    if when_full == "deny":
        return Refusal(403, "cluster-full", f"group {ref.key} needs {need} in one {choice.level}; none has room "
                                            f"now ({where} could when capacity frees up); retry later")
    return GroupPlan(ref, mode, choice.level, choice.value,
                     warnings=(f"group {ref.key} waits for room for {need} in {where}",), placement_hint=whole)


def with_requirement(pod: Mapping[str, Any], requirement: Mapping[str, Any]) -> dict[str, Any]:
    """The pod with `requirement` ANDed into every required node selector term (as the patch writes it),
    for placement to read through its usual node constraints."""
    spec = dict(mapping_of(pod.get("spec")))
    affinity = dict(mapping_of(spec.get("affinity")))
    node_affinity = dict(mapping_of(affinity.get("nodeAffinity")))
    required = mapping_of(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    terms = [dict(mapping_of(t)) for t in terms] if isinstance(terms, list) and terms else [{}]
    for term in terms:
        items = term.get("matchExpressions")
        term["matchExpressions"] = [*(items if isinstance(items, list) else []), dict(requirement)]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {**required, "nodeSelectorTerms": terms}
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity
    return {**pod, "spec": spec}


def placement_for(request: PodRequest, group: GroupPlan, snapshot: Snapshot,
                  ctx: PlacementContext) -> tuple[Placement, tuple[str, ...]]:
    """The pod's Placement inside its group's domain, and warnings. Required: only the domain's nodes
    are eligible. Preferred: the nodes it may use stay eligible; options come from the domain while it
    has room, from anywhere (with a warning) when it has none."""
    index = index_of(snapshot)
    requirement = group.requirement
    hint = group.placement_hint
    if requirement is None:
        return (hint if hint is not None else place(request, index, ctx)), ()
    inside = place(request.evolve(raw=with_requirement(request.raw, requirement)), index, ctx)
    if group.required:
        return inside, ()
    whole = hint if hint is not None else place(request, index, ctx)
    if inside.options:
        return Placement(whole.eligible, inside.options, whole.rejected), ()
    if whole.options:
        return whole, (f"group {group.ref.key}: {group.domain} has no room for this pod now: placed outside it",)
    return whole, ()
