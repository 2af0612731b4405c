"""GPU fragmentation of a node against a workload mix: what the "fragmentation" placement policy minimises.

The paper's measure (Weng et al., "Beware of Fragmentation", USENIX ATC 2023): a node's fragmentation
for one kind of task is the free GPU capacity that such a task cannot use - all of it when the task
cannot be hosted there at all, otherwise the free capacity of the GPUs too full for it - and the node's
fragmentation is its expected value over the workload mix. Placing each pod where that expectation
grows least (FGD) keeps the cluster able to host what is likely to come next.

This module's measure refines it in four ways:
- for kinds of task that share cards, "cannot use" is looked at over two horizons, weighed (FILLED): the
  paper's (what the next task of a kind could not use now) and the filled node's (what is left once as
  many tasks of that kind as the cards, CPU and memory allow have been placed). The second sees the
  share of a card that no whole number of such tasks fills, and a node whose CPU will run out before
  its GPUs do, before it is too late. Whole-card kinds keep the paper's view: what they leave unused
  is whole cards, which lighter kinds can still take;
- a card's remainder counts only as far as the card-sharing shares likely to come would leave it unused
  (`waste_table`): a 350 beside a 650 that common 320s fill costs little, a 190 beside an 810 that only
  rare 160s fit costs most of itself. That holds for a whole-card kind too: a shared card is no use to
  it, but is lost only as far as the shares leave it (counting it whole made any shared card look best
  for a share: best fit, blind to the 200 a 500 leaves beside a 300);
- kinds of task that only a few nodes can host weigh more on those nodes (the learned mix,
  core/mixlearn.py), so that, say, the only nodes with enough CPU for one 8-GPU job are not spent on
  small tasks;
- equal growth is broken towards the fuller node (best fit), keeping empty nodes for tasks needing them.

Cost: a state's values are kept by whoever holds its `Measured` (the scorer, per class of nodes and per
option: `nodeindex.StateMemo`), each kind of task's value apart from the mix's weights (`kinds.py`): a
decision costs a few look-ups per class of nodes, and a new mix a weighted sum per state (in C, over the
mix's indices and weights); a mix is compiled once per placement context (`context.CompiledMix`), and by
value for the functions below. The per-card answers are kept with the waste table they used
(`waste.Waste`, held by the compiled mix), shared by states that differ only in CPU and memory. Every memo
is bounded and keyed by values or held objects, so it never changes an answer.
"""

from __future__ import annotations

from array import array
from functools import lru_cache
from operator import mul

from webhook.core.domain.model import Node, NodeUsage

from . import kinds
from .context import WorkloadShape
from .kinds import Group, KindMix, compile_mix, compiled, default_mix
from .waste import COMMON, MILLI, RARE_FILL, Waste, changed_from, reach, waste_of, waste_table

__all__ = ["COMMON", "FILLED", "MILLI", "RARE_FILL", "TIE_BREAK", "Measured", "compiled_mix", "default_mix",
           "expected", "forget", "fragmentation_delta", "free_milli", "measured", "node_fragmentation",
           "node_state", "node_states", "states_delta", "waste_table"]

# Weight of the best-fit tie-break, in GPU units of fragmentation per GPU of free capacity left. Small
# enough never to outweigh a real difference in expected fragmentation (mix weights are normalised).
TIE_BREAK = 1e-4
# Weight of the filled-node horizon against the next-task one, for kinds of task that share cards. The
# next-task view already counts a remainder only as far as the mix's shares cannot fill it (`waste_table`),
# so it carries most of the weight; the filled view still sees CPU and memory running out before the cards.
FILLED = 0.2

# A node's state: free thousandths of each usable GPU (sorted, largest first), free CPU, free memory.
_State = tuple[tuple[int, ...], int, int]
_NAN = float("nan")


def forget() -> None:
    """Drop the compiled mixes and the answers kept with their waste tables: for a caller that is done
    with a cluster, so that the next one starts with small tables (a replay per seed)."""
    compile_mix.cache_clear()
    waste_of.cache_clear()
    _paper_fragmentation.cache_clear()


def free_milli(node: Node, usage: NodeUsage) -> tuple[int, ...]:
    """Free thousandths of each GPU (0 for a card held exclusively or unhealthy), in node order."""
    free: list[int] = []
    for i, gpu in enumerate(node.gpus):
        used = usage.gpus[i] if i < len(usage.gpus) else None
        if not gpu.healthy or (used is not None and used.exclusive):
            free.append(0)
            continue
        if used is None:
            free.append(MILLI)
            continue
        by_cores = MILLI - used.cores * 10
        by_memory = MILLI
        if gpu.memory_mib > 0:
            by_memory = (gpu.memory_mib - used.memory_mib) * MILLI // gpu.memory_mib
        free.append(max(0, min(by_cores, by_memory)))
    return tuple(free)


def _state(node: Node, usage: NodeUsage) -> _State:
    free = tuple(sorted((f for f in free_milli(node, usage) if f > 0), reverse=True))
    # Capacity 0 means "not reported": such a dimension never constrains.
    cpu = node.cpu_milli - usage.cpu_milli if node.cpu_milli > 0 else 1 << 40
    memory = node.memory_mib - usage.memory_mib if node.memory_mib > 0 else 1 << 40
    return free, cpu, memory


def node_fragmentation(node: Node, usage: NodeUsage, mix: tuple[WorkloadShape, ...], *, paper: bool = False) -> float:
    """Expected free GPU capacity on the node (GPU units) that a task drawn from the mix cannot use.

    `paper`: the ATC'23 paper's measure instead of this module's refinement.
    """
    return _value(node, usage, compiled(mix), paper)[0]


def fragmentation_delta(
    node: Node, before: NodeUsage, after: NodeUsage, mix: tuple[WorkloadShape, ...], *, paper: bool = False
) -> float:
    """How much the node's expected fragmentation grows from `before` to `after` (GPU units; lower is better).

    Includes a small best-fit term (TIE_BREAK per GPU left free) so that equal growth prefers the fuller node.
    """
    weighed = compiled(mix)
    was, _ = _value(node, before, weighed, paper)
    now, free = _value(node, after, weighed, paper)
    return now - was + TIE_BREAK * free / MILLI


def node_state(node: Node, usage: NodeUsage) -> _State:
    """The node's state as the measure sees it (what `node_states` gives before and after)."""
    return _state(node, usage)


def node_states(node: Node, before: NodeUsage | _State, after: NodeUsage) -> tuple[str, _State, _State]:
    """What `states_delta` needs of a node before and after a placement (`before` as usage or as the
    state an earlier call returned); it does not depend on the mix, so the scorer keeps it per class of
    nodes and a new mix costs two weighted sums per option."""
    was = _state(node, before) if isinstance(before, NodeUsage) else before
    return node.gpu_model.lower(), was, _state(node, after)


def states_delta(states: tuple[str, _State, _State], mix: tuple[WorkloadShape, ...]) -> float:
    """`fragmentation_delta` of the states `node_states` gave (the same value)."""
    model, before, after = states
    weighed = compiled(mix)
    return (_fragmentation(model, after, weighed) - _fragmentation(model, before, weighed)
            + TIE_BREAK * sum(after[0]) / MILLI)


class Measured:
    """One (GPU model, state): each kind's value (as long as the registry, NaN where not computed yet;
    `generation`: the registry's they are indexed by), and the expectation under the last mix asked for.
    The scorer holds these per class of nodes and per option (`nodeindex.StateMemo`), so that re-weighing
    an option under a new mix looks nothing up."""

    __slots__ = ("model", "state", "free", "values", "generation", "known", "mix", "expected", "waste")

    def __init__(self, model: str, state: _State) -> None:
        self.model = model
        self.state = state
        self.free = sum(state[0])  # free thousandths
        self.values = array("d", [_NAN]) * max(len(kinds.REGISTRY.indices), 1)
        self.generation = kinds.REGISTRY.generation
        self.known = 0  # the indices of the kinds computed, as bits
        self.mix: KindMix | None = None
        self.expected = 0.0
        self.waste: Waste | None = None  # the waste table (of the mix's shares) the values were computed against


def measured(model: str, state: _State) -> Measured:
    """A new `Measured` of the state, its values computed as mixes ask for them: its holder keeps it."""
    return Measured(model, state)


def compiled_mix(mix: tuple[WorkloadShape, ...]) -> KindMix:
    """The mix as `expected` takes it (memoised by value; a placement context keeps its own)."""
    return compiled(mix)


def expected(found: Measured, mix: KindMix) -> float:
    """The state's fragmentation under the mix (GPU units): `node_fragmentation`'s value."""
    if found.mix is mix:
        return found.expected
    if not found.state[0]:
        value = 0.0
    else:
        if mix.generation != kinds.REGISTRY.generation:
            mix.indexed()
        values = found.values
        if found.generation != kinds.REGISTRY.generation:
            # The registry was dropped (indices mean other kinds): compute again.
            values = found.values = array("d", [_NAN]) * max(len(kinds.REGISTRY.indices), 1)
            found.generation = kinds.REGISTRY.generation
            found.known = 0
            found.waste = mix.waste
        elif found.waste is not mix.waste:
            # The mix's shares changed, and so did what a card's remainder wastes, from some part of a card
            # on: the single-GPU kinds are computed again where they read the table that far (multi-GPU
            # kinds never read it).
            if (found.known and found.waste is not None
                    and changed_from(found.waste.sizes, mix.waste.sizes) <= reach(found.state[0])):
                found.known &= ~kinds.REGISTRY.shares
            found.waste = mix.waste
        if len(values) < len(kinds.REGISTRY.indices):
            grown = array("d", [_NAN]) * len(kinds.REGISTRY.indices)
            grown[: len(values)] = values
            values = found.values = grown
        missing = mix.mask & ~found.known
        if missing:
            _fill(found.model, found.state, values, mix.wanted(missing), mix.waste)
            found.known |= mix.mask
        # The weighted sum (Cost: in the docstring): a new mix re-weighs every state.
        value = sum(map(mul, mix.weights, mix.pick(values))) / MILLI
    found.mix, found.expected = mix, value
    return value


def _value(node: Node, usage: NodeUsage, mix: KindMix, paper: bool) -> tuple[float, int]:
    """(fragmentation, free thousandths) of the node in this state."""
    state = _state(node, usage)
    measure = _paper_fragmentation if paper else _fragmentation
    return measure(node.gpu_model.lower(), state, mix), sum(state[0])


def _fragmentation(model: str, state: _State, mix: KindMix) -> float:
    """Free thousandths a task from the mix cannot use: per kind of task that shares cards, two horizons
    weighed by FILLED; per whole-card kind, the next-task one.

    Next task (the paper's view): what one more such task could not use now. Filled node: what is left
    once as many such tasks as the cards, CPU and memory allow have been placed. Each kind's value is
    computed apart from the mix's weights (`Measured`), so that a holder of the state re-weighs it under
    a mix with other weights by the weighted sum alone.
    """
    if not state[0]:
        return 0.0
    return expected(measured(model, state), mix)


# Answers kept per waste table (`waste.Waste.cards`), at most this many card states each.
_CARDS_LIMIT = 1 << 15


def _fill(model: str, state: _State, values: array[float], groups: tuple[Group, ...], waste: Waste) -> None:
    """The values of the kinds of `groups` for the state (the measure the module docstring defines), a
    group at a time: a group whose largest CPU and memory needs the node can meet as often as the cards
    allow has one value for all its kinds."""
    free, cpu, memory = state
    total = sum(free)
    cards = waste.cards.get(free)
    if cards is None:
        if len(waste.cards) >= _CARDS_LIMIT:
            waste.cards.clear()
        cards = waste.cards[free] = {}
    for shape, models, most_cpu, most_memory, indices, members, _ in groups:
        if models and not any(m in model for m in models):  # the node's model is none the kind runs on
            for index in indices:
                values[index] = float(total)
            continue
        found = cards.get(shape)
        if found is None:
            slots, stranded, left = _cards(free, total, shape, waste.table)
            value = stranded if shape[1] == MILLI else FILLED * left + (1 - FILLED) * stranded
            found = cards[shape] = (slots or 1, slots, stranded, left, value)
        times, slots, stranded, left, value = found
        if cpu >= times * most_cpu and memory >= times * most_memory:
            # No kind of the group is held back by CPU or memory: each takes `slots` tasks.
            for index in indices:
                values[index] = value
            continue
        gpus, milli = shape
        if milli == MILLI:  # the next-task view only: all of it, or the stranded cards
            held, fitting_value = float(total), float(stranded)
            for index, cpu_need, memory_need in members:
                values[index] = held if cpu < cpu_need or memory < memory_need else fitting_value
            continue
        # A kind the node's CPU or memory cannot take once is worth all of it in both views; another is
        # stranded in the next-task view and limited by CPU and memory in the filled one.
        placed = gpus * milli
        held = FILLED * total + (1 - FILLED) * total
        next_part = (1 - FILLED) * stranded
        for index, cpu_need, memory_need in members:
            if cpu < cpu_need or memory < memory_need:
                values[index] = held
                continue
            tasks = slots
            if cpu_need and cpu // cpu_need < tasks:
                tasks = cpu // cpu_need
            if memory_need and memory // memory_need < tasks:
                tasks = memory // memory_need
            values[index] = FILLED * (left if tasks == slots else total - tasks * placed) + next_part


def _cards(free: tuple[int, ...], total: int, shape: tuple[int, int], waste: array[float]
           ) -> tuple[int, float, float]:
    """(slots, stranded, left) of free cards for tasks of a shape: how many such tasks the cards hold;
    the next-task view's loss (every free thousandth when no such task fits, else what the cards too
    full for one waste); and the filled view's (what the cards' remainders waste once filled with them).
    A single-GPU task's leftovers (a share's, or the shared cards a whole-card task cannot take) count
    only as far as the mix's shares cannot fill them (`waste_table`); a multi-GPU task's count whole."""
    gpus, milli = shape
    if gpus == 1:  # one pass over the cards (the sums in the order of the cards, as the docstring's)
        slots = 0
        stranded = left = 0.0
        for f in free:
            if f >= milli:
                slots += f // milli
                left += waste[f % milli]
            else:
                stranded += waste[f]
                left += waste[f]
        if not slots:
            return 0, float(total), float(total)
        if milli < MILLI:
            return slots, stranded, left
        # A whole card: the shared ones are lost to it only as far as the shares leave them.
        return slots, stranded, float(total - slots * milli)
    fitting = sum(1 for f in free if f >= milli)
    slots = fitting // gpus
    if fitting < gpus:
        return slots, float(total), float(total)
    return slots, float(sum(f for f in free if f < milli)), float(total - slots * gpus * milli)


@lru_cache(maxsize=1 << 16)
def _paper_fragmentation(model: str, state: _State, mix: KindMix) -> float:
    """The paper's measure: all free capacity for a kind the node cannot host now, else the too-full cards'."""
    free, cpu, memory = state
    total = sum(free)
    if total == 0:
        return 0.0
    expected = 0.0
    for gpus, milli, weight, cpu_need, memory_need, models in mix.kinds:
        hostable = not models or any(m in model for m in models)
        if not hostable or cpu < cpu_need or memory < memory_need:
            expected += weight * total
            continue
        fitting = sum(1 for f in free if f >= milli)
        expected += weight * (total if fitting < gpus else sum(f for f in free if f < milli))
    return expected / MILLI
