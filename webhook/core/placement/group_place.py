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
GPUs. Pods whose topology another system owns (another scheduler, Kueue's Topology-Aware Scheduling,
KAI-Scheduler's topology: `topology_owner`) keep their group in the decision record but get no domain:
that system places them.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from webhook.core.domain.model import Placement, Snapshot
from webhook.core.domain.names import GROUP_TOPOLOGY_ANNOTATION
from webhook.core.domain.podview import PodView
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.coerce import mapping_of
from webhook.core.podspec.view import labels_and_annotations, view_for
from webhook.core.policy.model import GROUP_MODES, Policy

from .context import PlacementContext
from .groups import GroupRecord, GroupRef, group_of, names_no_group
from .nodeindex import LEVELS, NodeClass, NodeIndex, State, Statics
from .place import place
from .state import index_of

DEFAULT_SCHEDULERS = ("", "default-scheduler")
REQUIRED, PREFERRED, NONE = GROUP_MODES

# Kueue TAS (apis/kueue/v1beta1 constants): the gate Kueue holds a TAS pod behind until it writes the
# assigned domain into the pod's nodeSelector, the label it puts on pods of a PodSet admitted through
# TAS, and the PodSet annotations on pod templates that request a topology.
KUEUE_TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
KUEUE_TAS_LABEL = "kueue.x-k8s.io/tas"
KUEUE_TOPOLOGY_ANNOTATIONS = ("kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology",
                              "kueue.x-k8s.io/podset-slice-required-topology")
KUEUE_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"  # a boolean: "true" requests TAS
# KAI-Scheduler: read from the workload (its podgrouper) and, where the template repeats them, the pod.
KAI_TOPOLOGY_ANNOTATIONS = ("kai.scheduler/topology", "kai.scheduler/topology-required-placement",
                            "kai.scheduler/topology-preferred-placement")
KAI_SCHEDULER = "kai-scheduler"
KUEUE_TAS, KAI = "Kueue TAS", "KAI"


class Level(NamedTuple):
    """The domains of one level as a group's first pod sees them, in pods like that pod (each on one
    node): columns indexed like `names`."""

    level: str
    names: tuple[str, ...]  # sorted
    capacity: Sequence[int]  # pods its eligible nodes hold when empty
    free: Sequence[int]  # pods they hold now, less what other groups' records promise there
    free_gpus: Sequence[int]  # idle GPUs now on nodes with room for such a pod, less those promises


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
    owner: str = ""  # another system places the group between nodes (`topology_owner`): no domain here
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


def mode_of(pod: Mapping[str, Any] | PodView, namespace: str, policy: Policy) -> str:
    """The pod's `gpu-admission.io/group-topology`, else its namespace's rule, else the policy's."""
    raw = labels_and_annotations(pod)[1].get(GROUP_TOPOLOGY_ANNOTATION)
    if raw is None:
        return policy.group_topology_for(namespace)
    if raw not in GROUP_MODES:
        raise ValueError(f"metadata.annotations[{GROUP_TOPOLOGY_ANNOTATION}]: expected one of "
                         f"{', '.join(GROUP_MODES)}, got {raw!r}")
    return str(raw)


def topology_owner(pod: Mapping[str, Any] | PodView, scheduler_name: str) -> str:
    """Who places the pod's group between nodes when not this webhook: "Kueue TAS", "KAI", the name of
    another scheduler, or "" (this webhook). A domain of ours beside theirs would fight them: Kueue gives
    each pod a nodeSelector for the domain it assigned, and a required affinity to another domain leaves
    the pod unschedulable. Kueue's pod webhook adds the gate at creation and may run after this one
    (configurations are called in name order; the reinvocation then finds our sealed record and changes
    nothing), so the PodSet annotations, which the pod has from its template before any webhook runs,
    count as much as the gate; so does the TAS label Job-based integrations copy from the template."""
    labels, annotations = labels_and_annotations(pod)
    gates = pod.scheduling_gates if isinstance(pod, PodView) else mapping_of(pod.get("spec")).get("schedulingGates")
    gated = isinstance(gates, (list, tuple)) and any(mapping_of(g).get("name") == KUEUE_TOPOLOGY_GATE for g in gates)
    unconstrained = str(annotations.get(KUEUE_UNCONSTRAINED, "")).lower() in ("true", "t", "1")  # Go ParseBool
    if (gated or unconstrained or labels.get(KUEUE_TAS_LABEL) == "true"
            or any(annotations.get(key) for key in KUEUE_TOPOLOGY_ANNOTATIONS)):
        return KUEUE_TAS
    if scheduler_name == KAI_SCHEDULER or any(annotations.get(key) for key in KAI_TOPOLOGY_ANNOTATIONS):
        return KAI
    return "" if scheduler_name in DEFAULT_SCHEDULERS else scheduler_name


# -- the domain table, once per (node set, eligible set, levels) ----------------------------------------


@dataclass(eq=False)
class Table:
    """The domains of an eligible node set. Per level, domains are numbered in name order; a node class's
    count of nodes per domain is kept as one integer with a 64-bit field per domain, so that summing
    the classes' counts, each times its free pods, is a few big-integer operations instead of a loop
    over domains per class (a 100k-GPU cluster has hundreds of cliques)."""

    levels: tuple[str, ...]  # present among the eligible nodes, innermost first
    domains: tuple[tuple[str, ...], ...]  # per level, its domains' names, sorted
    where: dict[str, tuple[int, ...]]  # eligible node -> its domain's number at each level (-1: none)
    healthy: dict[str, int]  # eligible node -> healthy GPUs
    capacity: dict[int, list[list[int]]] = field(default_factory=dict)  # GPUs per pod -> per level
    # A node class -> its packed counts per level. Classes are shared between index versions
    # (copy-on-write), so most are counted once, not once per admission. Classes and states hash by
    # identity (held here as keys).
    counted: dict[NodeClass, list[int]] = field(default_factory=dict)
    by_state: dict[State, tuple[tuple[str, ...], list[int]]] = field(default_factory=dict)

    def packed(self, node_class: NodeClass) -> list[int]:
        hit = self.counted.get(node_class)
        if hit is not None:
            return hit
        # A class that gained or lost a few nodes since last seen (the node an admission took moves from
        # one class to another): its old counts, adjusted, instead of counting thousands of names again.
        names = node_class.names
        state = node_class.state
        before = self.by_state.get(state)
        found = None
        few = max(_FEW, len(names) // 4)
        if before is not None and abs(len(before[0]) - len(names)) <= few:
            added, removed = set(names).difference(before[0]), set(before[0]).difference(names)
            if len(added) + len(removed) <= few:
                found = list(before[1])
                for changed, sign in ((added, 1), (removed, -1)):
                    for name in changed:
                        for i, j in enumerate(self.where.get(name, ())):
                            if j >= 0:
                                found[i] += sign << (_FIELD * j)
        if found is None:
            per_level = [[0] * len(d) for d in self.domains]
            for name in names:
                numbers = self.where.get(name)
                if numbers is not None:
                    for i, j in enumerate(numbers):
                        if j >= 0:
                            per_level[i][j] += 1
            found = [_pack(counts) for counts in per_level]
        if len(self.counted) >= 8192:
            self.counted.clear()
            self.by_state.clear()
        self.counted[node_class] = found
        self.by_state[state] = (names, found)
        return found

    def capacity_for(self, gpus: int) -> list[list[int]]:
        found = self.capacity.get(gpus)
        if found is None:
            found = [[0] * len(d) for d in self.domains]
            for name, numbers in self.where.items():
                pods = self.healthy[name] // gpus
                for i, j in enumerate(numbers):
                    if j >= 0:
                        found[i][j] += pods
            self.capacity[gpus] = found
        return found


_FIELD = 8 * array("Q").itemsize  # bits per packed count
_FEW = 16  # names a class may gain or lose (or a quarter of it) and be adjusted rather than counted again


def _pack(counts: list[int]) -> int:  # fields of array("Q").itemsize bytes (8 on every CPython)
    return int.from_bytes(array("Q", counts).tobytes(), sys.byteorder)  # the array's own byte order


def _unpack(packed: int, size: int) -> array[int]:
    out = array("Q")
    out.frombytes(packed.to_bytes(out.itemsize * size, sys.byteorder))
    return out


_TABLES_LIMIT = 64  # tables kept per node set and levels


def table_of(statics: Statics, eligible: tuple[str, ...], levels: tuple[str, ...]) -> Table:
    """Kept with the node set (`Statics.tables`), per levels and eligible tuple, that tuple told by
    identity (placement memoises the eligible sets; hashing thousands of names per look-up would show)."""
    memo = statics.tables.get(levels)
    if memo is None:
        memo = statics.tables.setdefault(levels, [])
    for seen, held in reversed(memo):
        if seen is eligible:
            found: Table = held
            return found
    nodes = statics.nodes
    present = tuple(lv for lv in levels if any(lv in nodes[n].labels for n in eligible if n in nodes))
    domains = tuple(tuple(sorted({nodes[n].labels[lv] for n in eligible if n in nodes and lv in nodes[n].labels}))
                    for lv in present)
    numbering = [{value: j for j, value in enumerate(d)} for d in domains]
    where: dict[str, tuple[int, ...]] = {}
    healthy: dict[str, int] = {}
    for name in eligible:
        node = nodes.get(name)
        if node is None:
            continue
        numbers = tuple(numbering[i].get(node.labels.get(lv, ""), -1) if lv in node.labels else -1
                        for i, lv in enumerate(present))
        if any(j >= 0 for j in numbers):
            where[name] = numbers
            healthy[name] = sum(1 for g in node.gpus if g.healthy)
    table = Table(present, domains, where, healthy)
    if len(memo) >= _TABLES_LIMIT:
        memo.clear()
    memo.append((eligible, table))
    return table


def rooms(table: Table, index: NodeIndex, gpus: int, records: Mapping[str, Any]) -> list[Level]:
    """Per present level, every domain's room for pods of `gpus` GPUs now. Walks only the node classes
    with at least `gpus` idle GPUs (the index's buckets from LEVELS + gpus), not every node."""
    gpus = max(gpus, 1)
    capacity = table.capacity_for(gpus)
    free = [0] * len(table.levels)
    idle_gpus = [0] * len(table.levels)
    for shape in index.statics.shapes:
        for node_class in index.classes(shape, LEVELS + gpus):
            idle = node_class.state.idle.bit_count()
            pods = idle // gpus
            for i, packed in enumerate(table.packed(node_class)):
                free[i] += pods * packed
                idle_gpus[i] += idle * packed
    out = [Level(level, table.domains[i], capacity[i], _unpack(free[i], len(table.domains[i])).tolist(),
                 _unpack(idle_gpus[i], len(table.domains[i])).tolist()) for i, level in enumerate(table.levels)]
    where = {level: i for i, level in enumerate(table.levels)}
    promised: dict[tuple[str, str], int] = {}
    for record in records.values():  # few: the groups whose pods are still to come
        if isinstance(record, GroupRecord) and record.promised_gpus and record.level in where:
            at = (record.level, record.domain)
            promised[at] = promised.get(at, 0) + record.promised_gpus
    for (level, value), held in promised.items():
        found = out[where[level]]
        j = bisect_left(found.names, value)
        if j < len(found.names) and found.names[j] == value:
            assert isinstance(found.free, list) and isinstance(found.free_gpus, list)
            found.free[j] = max(found.free[j] - -(-held // gpus), 0)
            found.free_gpus[j] -= held
    return out


def choose(levels: list[Level], pods: int, open_ended: bool) -> Choice | None:
    """The innermost level where some domain could ever hold `pods`; there, the best domain with room now
    (best fit: fewest GPUs left free, then the name; open-ended: the most room, then the name), else the
    one with most room now and then most capacity (the group waits). None: no domain ever could."""
    for lv in levels:
        names, capacity, free, free_gpus = lv.names, lv.capacity, lv.free, lv.free_gpus
        ever = [j for j in range(len(names)) if capacity[j] >= pods]
        if not ever:
            continue
        now = [j for j in ever if free[j] >= pods]
        if now:
            if open_ended:
                best = min(now, key=lambda j: (-free[j], -free_gpus[j], names[j]))
            else:
                best = min(now, key=lambda j: (free_gpus[j], free[j], names[j]))
            return Choice(lv.level, names[best], True)
        wait = min(ever, key=lambda j: (-free[j], -capacity[j], names[j]))
        return Choice(lv.level, names[wait], False)
    return None


# -- admission ------------------------------------------------------------------------------------------


def placed_here(pod: Mapping[str, Any], namespace: str, policy: Policy,
                sizes: Mapping[str, int] | None = None) -> GroupRef | None:
    """The pod's multi-pod group when this webhook places it: None for a pod of no group, one whose
    topology another scheduler, Kueue TAS or KAI owns (they place the group), or with groups off
    (`none`). A malformed group annotation is `plan`'s to refuse, with the field named; here it only
    means there is no group to record."""
    if names_no_group(pod):  # most pods: none of the group keys, nothing more to read
        return None
    try:
        ref = group_of(pod, namespace, sizes)
        if ref is None or mode_of(pod, namespace, policy) == NONE:
            return None
    except ValueError:
        return None
    scheduler = mapping_of(pod.get("spec")).get("schedulerName") or ""
    return None if topology_owner(pod, str(scheduler)) else ref


def plan(request: PodRequest, snapshot: Snapshot, policy: Policy, ctx: PlacementContext,
         when_full: str) -> GroupPlan | Refusal | None:
    """The group step of a pod's mutation: None for a pod of no group."""
    view = view_for(request)
    try:
        ref = group_of(view, request.namespace, snapshot.group_sizes)
        if ref is None:
            return None
        mode = mode_of(view, request.namespace, policy)
    except ValueError as err:
        return Refusal("invalid-group", 422, str(err))
    owner = topology_owner(view, request.scheduler_name)
    if owner:  # its group stays in the decision record; quotas and the GPUs inside the node stay ours
        return GroupPlan(ref, mode, owner=owner)
    if mode == NONE:
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
        largest = max(levels[-1].capacity, default=0) * gpus
        message = f"group {ref.key} needs {need} in one {table.levels[-1]}; the largest has {largest}"
        if mode == REQUIRED:
            return Refusal("group-too-large", 422, message)
        return GroupPlan(ref, mode, warnings=(message + ": placed split",), placement_hint=whole)
    if choice.now:
        return GroupPlan(ref, mode, choice.level, choice.value, placement_hint=whole)
    where = f"{choice.level}={choice.value}"
    if mode == PREFERRED:
        return GroupPlan(ref, mode, warnings=(f"group {ref.key} placed split: no {choice.level} has room for "
                                              f"{need} now",), placement_hint=whole)
    if when_full == "deny":
        return Refusal("cluster-full", 403, f"group {ref.key} needs {need} in one {choice.level}; none has room "
                                            f"now ({where} could when capacity frees up); retry later")
    return GroupPlan(ref, mode, choice.level, choice.value,
                     warnings=(f"group {ref.key} waits for room for {need} in {where}",), placement_hint=whole)


def with_requirement(request: PodRequest, requirement: Mapping[str, Any]) -> PodRequest:
    """The request of the pod with `requirement` ANDed into every required node selector term (as the
    patch writes it), for placement to read through its usual node constraints: its raw pod and its view
    both carry the new affinity."""
    view = view_for(request)
    pod = request.raw
    affinity = dict(view.affinity)
    node_affinity = dict(mapping_of(affinity.get("nodeAffinity")))
    required = mapping_of(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    terms = [dict(mapping_of(t)) for t in terms] if isinstance(terms, list) and terms else [{}]
    for term in terms:
        items = term.get("matchExpressions")
        term["matchExpressions"] = [*(items if isinstance(items, list) else []), dict(requirement)]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {**required, "nodeSelectorTerms": terms}
    affinity["nodeAffinity"] = node_affinity
    raw = {**pod, "spec": {**mapping_of(pod.get("spec")), "affinity": affinity}}
    return request.evolve(raw=raw, view=replace(view, raw=raw, affinity=affinity))


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
    inside = place(with_requirement(request, requirement), index, ctx)
    if group.required:
        return inside, ()
    whole = hint if hint is not None else place(request, index, ctx)
    if inside.options:
        return Placement(whole.eligible, inside.options, whole.rejected), ()
    if whole.options:
        return whole, (f"group {group.ref.key} placed outside {group.domain}: no room there for this pod now",)
    return whole, ()
