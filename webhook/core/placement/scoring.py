"""How good each candidate node is under each placement policy: higher scores are better.

Scores are computed once per class of equivalent nodes. Built-in policies follow the FGD paper's
baselines (best-fit, dot-product) and the usual packing heuristics; "fragmentation" delegates to the
fragmentation measure; custom scorers see the node, its usage and the candidate option.

Cost: scores are memoised per node state (its `memo`), and the fragmentation scorer reads a state's
expected value straight off it when it was computed for the same compiled mix (`expected`'s memo,
looked up inline in the per-class loop); the arithmetic is `states_delta`'s either way.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.domain.model import Node, NodeUsage, Option
from webhook.core.domain.request import PodRequest

from .context import PlacementContext
from .fitting import Choice, Demand, Fit
from .fragmentation import MILLI, TIE_BREAK, compiled_mix, default_mix, expected, measured, node_state, node_states
from .nodeindex import State, remember, taken
from .topology import expected_loss


@dataclass(slots=True)
class Candidate:
    """One class of equivalent nodes that can host the pod now, with the GPUs it would get."""

    state: State
    names: tuple[str, ...]
    choice: Choice
    fit: Fit
    allowed: int  # the GPUs the pod may use on these nodes (bitmask)
    loss: float = 0.0
    score: float = 0.0


def score_all(
    cands: list[Candidate],
    request: PodRequest,
    demand: Demand,
    ctx: PlacementContext,
    nodes: Mapping[str, Node],
    token: Callable[[Any], int],
) -> None:
    """Set each candidate's score; a weighted combination min-max normalises each policy first.

    The fragmentation policy also chooses which of a node's equivalent GPUs the pod takes: that choice is
    made first, and every policy scores it, so the result never depends on the order of the names."""
    weights = {ctx.policy: 1.0} if isinstance(ctx.policy, str) else dict(ctx.policy)
    chosen: dict[str, list[float]] = {}  # scores already worked out with the GPU choice
    if "fragmentation" in weights and "fragmentation" not in ctx.scorers:
        _fragmentation_choices(cands, demand, ctx, token)
        if len(weights) == 1:  # the policy alone: its scores as they come
            weight = weights["fragmentation"]
            if weight != 1.0:
                for cand in cands:
                    cand.score *= weight
            return
        chosen["fragmentation"] = [cand.score for cand in cands]
    if len(weights) == 1:
        ((name, weight),) = weights.items()
        scores = chosen[name] if name in chosen else _policy_scores(name, cands, request, demand, ctx, nodes, token)
        for cand, value in zip(cands, scores, strict=True):
            cand.score = weight * value
        return
    totals = [0.0] * len(cands)
    for name, weight in sorted(weights.items()):
        scores = chosen[name] if name in chosen else _policy_scores(name, cands, request, demand, ctx, nodes, token)
        low, high = (min(scores), max(scores)) if scores else (0.0, 0.0)
        span = high - low
        for i, value in enumerate(scores):
            totals[i] += weight * ((value - low) / span if span > 0 else 0.0)
    for cand, total in zip(cands, totals, strict=True):
        cand.score = total


def _policy_scores(
    name: str,
    cands: list[Candidate],
    request: PodRequest,
    demand: Demand,
    ctx: PlacementContext,
    nodes: Mapping[str, Node],
    token: Callable[[Any], int],
) -> list[float]:
    if name in ctx.scorers:
        scorer = ctx.scorers[name]
        # Called once per class of equivalent nodes, with the first of them (by name).
        return [scorer(request, nodes[c.names[0]], c.state.usage, option_of(c, c.names[0], ctx)) for c in cands]
    if name == "random":
        rng = random.Random(ctx.seed)
        return [rng.random() for _ in cands]
    if name not in _SCORES:
        raise ValueError(f"unknown placement policy {name!r}")
    score = _SCORES[name]
    return [score(c.state, c.choice, demand) for c in cands]


def _healthy(state: State) -> int:
    return max(1, state.shape.healthy.bit_count())


def _fullness(state: State, demand: Demand) -> float:
    """How full the node is, 0..1: its GPUs for a GPU pod; its CPU or memory, the fuller, for a pod without."""
    if demand.count > 0:
        return state.used_units / _healthy(state)
    node = state.shape.template
    cpu = 1 - state.free_cpu / node.cpu_milli if node.cpu_milli > 0 else 0.0
    memory = 1 - state.free_memory / node.memory_mib if node.memory_mib > 0 else 0.0
    return max(cpu, memory)


def _binpack(state: State, choice: Choice, demand: Demand) -> float:
    return _fullness(state, demand)


def _spread(state: State, choice: Choice, demand: Demand) -> float:
    return -_fullness(state, demand)


def _fewest_tasks(state: State, choice: Choice, demand: Demand) -> float:
    return -state.usage.gpu_tasks + 0.5 * (1 - _fullness(state, demand))


def _taken(state: State, choice: Choice, demand: Demand) -> float:
    """GPU units the pod takes on this node."""
    if demand.exclusive:
        return float(len(choice.gpus))
    gpus = state.shape.template.gpus
    return sum(
        max(choice.memory / gpus[i].memory_mib if gpus[i].memory_mib else 0.0, choice.cores / 100) for i in choice.gpus
    )


def _best_fit(state: State, choice: Choice, demand: Demand) -> float:
    """Least remaining CPU and GPU after placement, each scaled by the node's capacity (FGD's best-fit)."""
    node = state.shape.template
    gpu_left = (_healthy(state) - state.used_units - _taken(state, choice, demand)) / _healthy(state)
    cpu_left = (state.free_cpu - demand.cpu) / node.cpu_milli if node.cpu_milli > 0 else 0.0
    return -(0.5 * gpu_left + 0.5 * cpu_left)


def _dot_product(state: State, choice: Choice, demand: Demand) -> float:
    """Tetris alignment of request and free capacity; as FGD's baseline, the smaller product wins."""
    node = state.shape.template
    healthy = _healthy(state)
    gpu = (healthy - state.used_units) / healthy * _taken(state, choice, demand) / healthy
    cpu = state.free_cpu * demand.cpu / node.cpu_milli**2 if node.cpu_milli > 0 else 0.0
    return -(gpu + cpu) / 2


_SCORES: Mapping[str, Callable[[State, Choice, Demand], float]] = {
    "binpack": _binpack,
    "spread": _spread,
    "fewest-tasks": _fewest_tasks,
    "best-fit": _best_fit,
    "dot-product": _dot_product,
}


def _fragmentation_choices(
    cands: list[Candidate], demand: Demand, ctx: PlacementContext, token: Callable[[Any], int]
) -> None:
    """Set each candidate's GPUs to those that least grow the node's expected fragmentation (a shared pod
    tries each distinct GPU of the node), and its score to minus that growth.

    Memoised per node state: between two decisions only the classes that changed are evaluated again.
    """

    placing, compiled = fragmentation_memo(demand, ctx, token)
    for cand in cands:
        key = (placing, cand.allowed)
        entry = cand.state.memo.fragmentation.get(key)
        if entry is None or entry[0] is not compiled:
            entry = weighed(cand, key, entry, compiled, demand)
        cand.score = entry[1]
        cand.choice = entry[2]


def fragmentation_memo(demand: Demand, ctx: PlacementContext, token: Callable[[Any], int]) -> tuple[int, Any]:
    """What a fragmentation memo entry is looked up by: the pod's placement token (with each candidate's
    allowed GPUs) and the compiled mix it must have been weighed under."""
    placing = token(("fragmentation", demand.key, demand.gpu_policy or ctx.gpu_policy))
    compiled = ctx.compiled.mix
    if compiled is None:
        compiled = ctx.compiled.mix = compiled_mix(ctx.workload_mix or default_mix())
    return placing, compiled


def weighed(cand: Candidate, key: tuple[int, int], entry: Any, compiled: Any, demand: Demand) -> Any:
    """The candidate's memo entry under the mix: (mix, minus the growth, the GPUs, the state before, each
    option with the state after). The states do not depend on the mix, so they are kept with the answer
    and a new (learned) mix re-weighs them without placing the pod again. The entry is replaced whole,
    never changed: a reader never sees one mix's answer with another's."""
    if entry is None:
        node = cand.state.shape.template
        alternatives = [cand.choice]
        if not demand.exclusive and demand.count == 1:
            alternatives = list(cand.choice.alternatives) or alternatives
        before, after = _options(cand.state, node, alternatives, demand)
    else:
        before, after = entry[3], entry[4]
    # `expected` (Cost: in the docstring).
    was = before.expected if before.mix is compiled else expected(before, compiled)
    best: tuple[float, Choice] | None = None
    for choice, state in after:
        now = state.expected if state.mix is compiled else expected(state, compiled)
        delta = now - was + TIE_BREAK * state.free / MILLI
        if best is None or delta < best[0]:
            best = (delta, choice)
    assert best is not None
    return remember(cand.state.memo.fragmentation, key, (compiled, -best[0], best[1], before, after))


def _options(state: State, node: Node, alternatives: list[Choice], demand: Demand) -> tuple[Any, Any]:
    """The node's state before (`fragmentation.Measured`), and each alternative with the state after it.
    The free cards after taking some GPUs do not depend on the pod's CPU and memory: kept per class and
    GPUs taken, so that pods of one share but other CPU and memory only subtract those."""

    memo = state.memo
    before = memo.before
    if before is None:
        before = memo.before = measured(node.gpu_model.lower(), node_state(node, state.usage))
    model = before.model
    was = before.state
    cpu = was[1] - demand.cpu if node.cpu_milli > 0 else was[1]
    host_memory = was[2] - demand.host_memory if node.memory_mib > 0 else was[2]
    after = []
    for choice in alternatives:
        if choice.gpus:
            key = (choice.gpus, choice.memory, choice.cores, demand.exclusive)
            free = memo.free_after.get(key)
            if free is None:
                taking = taken(node, state.usage, choice.gpus, choice.memory, choice.cores, demand.exclusive, 0, 0)
                free = remember(memo.free_after, key, node_states(node, was, taking)[2][0])
        else:
            free = was[0]
        after.append((choice, measured(model, (free, cpu, host_memory))))
    return before, tuple(after)


def option_of(cand: Candidate, name: str, ctx: PlacementContext) -> Option:
    choice = cand.choice
    loss = expected_loss(choice.topology, ctx.topology_loss)  # the candidate's `loss` is set for ranking only
    return Option(name, choice.gpus, choice.memory, choice.cores, choice.topology, loss, cand.score)


def usage_after(usage: NodeUsage, choice: Choice, demand: Demand, node: Node) -> NodeUsage:
    return taken(node, usage, choice.gpus, choice.memory, choice.cores, demand.exclusive, demand.cpu,
                 demand.host_memory)
