"""Which classes of nodes can host a GPU pod now, with the GPUs each would give it: the candidates that
placement then scores and ranks (place.py).

Cost: in the loop over a shape's classes, choose_gpus' memo (per node state) and reach.within's (per names
tuple, held with it) are looked up inline, not through the helpers: that loop runs once per class per
decision. Nodes whose GPUs the pod names by UUID are few, and looked at one by one (`_restricted`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from .context import PlacementContext
from .fitting import Demand, Fit, choose_gpus, static_verdict
from .nodeindex import NodeIndex, Shape
from .nodereach import ShapeReach, Subset, count_rejections
from .scoring import Candidate

_NONE: Mapping[str, int] = {}  # shared and never written: no UUID excluded on a shape


def uuid_masks(index: NodeIndex, demand: Demand) -> tuple[dict[str, int] | None, dict[str, int]]:
    """Per node, the GPUs the pod's UUID lists allow (include: only listed nodes) and forbid."""
    include: dict[str, int] | None = None
    if demand.uuids_include:
        include = {}
        for uuid in demand.uuids_include:
            where = index.statics.uuid_node.get(uuid)
            if where is not None:
                include[where[0]] = include.get(where[0], 0) | 1 << where[1]
    exclude: dict[str, int] = {}
    for uuid in demand.uuids_exclude:
        where = index.statics.uuid_node.get(uuid)
        if where is not None:
            exclude[where[0]] = exclude.get(where[0], 0) | 1 << where[1]
    return include, exclude


def candidates(
    index: NodeIndex,
    demand: Demand,
    ctx: PlacementContext,
    rejected: dict[str, int],
    eligible: list[str] | None,
    reach: ShapeReach | None,
) -> list[Candidate]:
    """Classes that can host the pod now; counts the others in `rejected`, collects `eligible` if asked.
    `reach`: the nodes the pod's own constraints allow, per shape (None: all)."""
    include, exclude = uuid_masks(index, demand)
    token = index.statics.token(demand.key)
    gpu_policy = demand.gpu_policy or ctx.gpu_policy
    out: list[Candidate] = []

    def reject(reason: str, count: int) -> None:
        if count:
            rejected[reason] = rejected.get(reason, 0) + count

    for shape in index.statics.shapes:
        reachable = reach.names.get(shape.number) if reach is not None else None  # None: all
        if reachable is not None:
            assert reach is not None
            count_rejections(reach, shape, rejected)
            if not reachable:
                continue
        verdict = static_verdict(shape, demand)
        if isinstance(verdict, str):
            reject(verdict, len(shape.names) if reachable is None else len(reachable))
            continue
        if include is not None:
            masks = include if reachable is None else {n: m for n, m in include.items() if n in reachable}
            pinned = _restricted(index, shape, verdict, demand, token, gpu_policy, masks, True)
            _take(pinned, out, reject, eligible)
            here = sum(1 for n in masks if index.statics.shape_of[n] is shape)
            reject("uuid", (len(shape.names) if reachable is None else len(reachable)) - here)  # not named
            continue
        special = {n: m for n, m in exclude.items() if index.statics.shape_of[n] is shape} if exclude else _NONE
        if special and reachable is not None:
            special = {n: m for n, m in special.items() if n in reachable}
        if special:
            _take(_restricted(index, shape, verdict, demand, token, gpu_policy, special, False), out, reject, eligible)
        if eligible is not None:
            names_here = shape.names if reachable is None else list(reachable)
            eligible.extend(n for n in names_here if n not in special) if special else eligible.extend(names_here)
        key = (token, verdict.allowed, gpu_policy)  # choose_gpus' memo key (Cost: in the module docstring)
        if reachable is None and not special:  # every class of the shape, whole (the common case)
            _whole_shape(index, shape, verdict, key, demand, gpu_policy, token, out, reject)
        else:
            _narrowed_shape(index, shape, verdict, key, demand, gpu_policy, token, (reach, reachable, special), out,
                            reject)
    return out


def _whole_shape(index: NodeIndex, shape: Shape, verdict: Fit, key: tuple[int, int, str], demand: Demand,
                 gpu_policy: str, token: int, out: list[Candidate], reject: Callable[[str, int], None]) -> None:
    """Every class of a shape that can host the pod now, into `out`; nodes without room for the pod on any
    GPU are counted ("busy"), never looked at."""
    first = verdict.first_bucket
    busy = index.count_below(shape, first)
    allowed = verdict.allowed
    for node_class in index.classes(shape, first):
        state = node_class.state
        choice = state.memo.choices.get(key)
        if choice is None:
            choice = choose_gpus(state, verdict, allowed, demand, gpu_policy, token)
        if isinstance(choice, str):
            reject(choice, len(node_class.names))
        else:
            out.append(Candidate(state, node_class.names, choice, verdict, allowed))
    reject("busy", busy)


def _narrowed_shape(index: NodeIndex, shape: Shape, verdict: Fit, key: tuple[int, int, str], demand: Demand,
                    gpu_policy: str, token: int,
                    narrowed: tuple[ShapeReach | None, Subset | None, Mapping[str, int]],
                    out: list[Candidate], reject: Callable[[str, int], None]) -> None:
    """`_whole_shape` for a shape of which the pod may use only some nodes: those its constraints reach
    (`reachable`, None: all), less those whose GPUs it names by UUID (`special`, looked at one by one)."""
    reach, reachable, special = narrowed
    filtered = reach.filtered if reach is not None else {}
    first = verdict.first_bucket
    if reachable is None:
        busy = index.count_below(shape, first)
        if special:
            busy -= sum(1 for n in special if shape.state(index.usage(n)).bucket < first)
    else:
        busy = len(reachable) - len(special)  # less those seen in the classes below
    allowed = verdict.allowed
    for node_class in index.classes(shape, first):
        names = node_class.names
        if reachable is not None:
            hit = filtered.get(id(names))  # reach.within's memo (Cost: in the module docstring)
            if hit is not None and hit[0] is names:
                names = hit[1]
            else:
                assert reach is not None
                names = reach.within(names, reachable)
        if special and any(n in special for n in names):
            names = tuple(n for n in names if n not in special)
        if not names:
            continue
        if reachable is not None:
            busy -= len(names)
        choice = node_class.state.memo.choices.get(key)
        if choice is None:
            choice = choose_gpus(node_class.state, verdict, allowed, demand, gpu_policy, token)
        if isinstance(choice, str):
            reject(choice, len(names))
        else:
            out.append(Candidate(node_class.state, names, choice, verdict, allowed))
    reject("busy", busy)


class _Pinned(NamedTuple):
    """What looking at nodes one by one found: candidates, rejections in the order met, eligible names."""

    candidates: list[Candidate]
    rejected: dict[str, int]
    eligible: list[str]


def _restricted(index: NodeIndex, shape: Shape, fit: Fit, demand: Demand, token: int, gpu_policy: str,
                masks: Mapping[str, int], only: bool) -> _Pinned:
    """The nodes of `shape` among `masks`, one at a time (there are few): the pod names GPUs by UUID, and
    `masks` has each node's named GPUs, which it may use only (`only`) or must not use."""
    found = _Pinned([], {}, [])
    for name in sorted(masks):
        if index.statics.shape_of[name] is not shape:
            continue
        allowed = fit.allowed & masks[name] if only else fit.allowed & ~masks[name]
        if allowed.bit_count() < demand.count:
            found.rejected["uuid"] = found.rejected.get("uuid", 0) + 1
            continue
        if demand.required and not shape.graph.could_nvlink(allowed, demand.count):
            found.rejected["topology"] = found.rejected.get("topology", 0) + 1
            continue
        found.eligible.append(name)
        state = shape.state(index.usage(name))
        choice = choose_gpus(state, fit, allowed, demand, gpu_policy, token)
        if isinstance(choice, str):
            found.rejected[choice] = found.rejected.get(choice, 0) + 1
        else:
            found.candidates.append(Candidate(state, (name,), choice, fit, allowed))
    return found


def _take(pinned: _Pinned, out: list[Candidate], reject: Callable[[str, int], None],
          eligible: list[str] | None) -> None:
    out.extend(pinned.candidates)
    for reason, count in pinned.rejected.items():
        reject(reason, count)
    if eligible is not None:
        eligible.extend(pinned.eligible)
