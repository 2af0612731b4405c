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

Cost: everything is memoised per (GPU model, free-capacity vector, CPU and memory left), each kind of
task's value apart from the mix's weights: in a cluster the same states recur constantly, so a decision
costs a few dictionary lookups per class of nodes, and a new mix a weighted sum per state (in C, over
the mix's indices and weights); a mix is compiled once per placement context (`context.CompiledMix`), and
by value for the functions below. The per-card answers are kept with the waste table they used, shared by
states that differ only in CPU and memory. Every memo is bounded and keyed by values or held objects, so
it never changes an answer.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from functools import lru_cache
from operator import itemgetter, mul

from webhook.core.domain.model import Node, NodeUsage

from .context import HashedTuple, WorkloadShape

MILLI = 1000  # one whole GPU
# Weight of the best-fit tie-break, in GPU units of fragmentation per GPU of free capacity left. Small
# enough never to outweigh a real difference in expected fragmentation (mix weights are normalised).
TIE_BREAK = 1e-4
# Weight of the filled-node horizon against the next-task one, for kinds of task that share cards. The
# next-task view already counts a remainder only as far as the mix's shares cannot fill it (`waste_table`),
# so it carries most of the weight; the filled view still sees CPU and memory running out before the cards.
FILLED = 0.2

# A node's state: free thousandths of each usable GPU (sorted, largest first), free CPU, free memory.
_State = tuple[tuple[int, ...], int, int]
# One kind of task, compiled: (gpus, milli, normalised weight, cpu_milli, memory_mib, lower-cased models).
_Kind = tuple[int, int, float, int, int, tuple[str, ...]]


class _Mix:
    """A compiled mix. Hashed by identity, so that memo lookups do not rehash every kind.

    `entries`: (index of the kind in every state's vector of per-kind values, weight, kind), re-indexed
    when the kind registry was dropped (`generation`); `groups`: the same kinds by (GPUs, share, models),
    for filling a state's vector a group at a time; `mask`: the kinds' indices as bits."""

    __slots__ = ("kinds", "entries", "generation", "indices", "pick", "weights", "groups", "mask", "sizes", "wanting",
                 "distances")

    def __init__(self, kinds: tuple[_Kind, ...]) -> None:
        self.kinds = kinds
        # The shares single-GPU kinds take of a card, each with its chance of filling a remainder it fits
        # (their waste table: `_waste`).
        self.sizes = _canonical(_fill_chances(kinds))
        self.entries: tuple[tuple[int, float, _Kind], ...] = ()
        self.generation = -1
        self.indices: tuple[int, ...] = ()  # the entries' indices and weights apart, for the weighted sum
        self.pick: Callable[[array[float]], tuple[float, ...]] = _none  # a state's values at `indices`, in C
        self.weights: tuple[float, ...] = tuple(k[2] for k in kinds)
        self.groups: tuple[_Group, ...] = ()
        self.mask = 0
        # Missing kinds (bits) -> the groups holding them: after a mix gains a kind, every state it weighs
        # misses the same few, so a state fills those groups only (`wanted`).
        self.wanting: dict[int, tuple[_Group, ...]] = {}
        self.distances: dict[_Mix, float] = {}  # other mix -> `distance`

    def indexed(self) -> tuple[tuple[int, float, _Kind], ...]:
        if self.generation != _REGISTRY.generation:
            generation = _REGISTRY.generation
            entries = tuple((_REGISTRY.index(k), k[2], k) for k in self.kinds)
            if _REGISTRY.generation != generation:  # dropped meanwhile: index them all again, no drop now
                entries = tuple((_REGISTRY.index(k, drop=False), k[2], k) for k in self.kinds)
            self.entries = entries
            self.indices = tuple(e[0] for e in entries)
            self.pick = _picker(self.indices)
            self.groups = _groups(entries)
            self.mask = sum(1 << i for i in set(self.indices))
            self.wanting = {}
            self.generation = _REGISTRY.generation  # last: a reader that sees it sees the rest
        return self.entries

    def distance(self, other: _Mix) -> float:
        """How far the kinds' weights moved from `other` to this mix: the sum of each kind's change (a
        kind in one mix only counts its whole weight); inf when the two have other shares or chances of
        filling (the kinds' values differ too: `waste_table`) or `other` was indexed against a dropped
        registry. Between mixes
        of the same shares, a state's expected value moves by at most this times its free capacity (a
        kind's value lies between 0 and the free capacity)."""
        if self.generation != _REGISTRY.generation:
            self.indexed()
        if other.generation != self.generation or other.sizes is not self.sizes:
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

    def wanted(self, missing: int) -> tuple[_Group, ...]:
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


# A share that makes at least 1/COMMON of the card-sharing kinds' weight fills a remainder it fits; a
# rarer one does with a chance of RARE_FILL (`waste_table`). Two levels only, on purpose: the table and
# every state's values change when a share crosses the line, not with each new mix.
COMMON = 32
RARE_FILL = 0.25


def _fill_chances(kinds: tuple[_Kind, ...]) -> tuple[tuple[int, float], ...]:
    """Each single-GPU share under a whole card, with its chance of filling a remainder (by share)."""
    weights: dict[int, float] = {}
    for gpus, milli, weight, *_ in kinds:
        if gpus == 1 and milli < MILLI:
            weights[milli] = weights.get(milli, 0.0) + weight
    total = sum(weights.values()) or 1.0
    return tuple(sorted((milli, 1.0 if COMMON * weight / total >= 1.0 else RARE_FILL)
                        for milli, weight in weights.items()))


@lru_cache(maxsize=64)
def waste_table(sizes: tuple[tuple[int, float], ...]) -> array[float]:
    """For each free part of a card (0..MILLI thousandths), how much of it stays unused when tasks of the
    mix's card-sharing shares come to fill it: each share that fits comes with its chance (`sizes`,
    scaled down to sum to 1 where they pass it), and what none takes is lost. A card's remainder that a
    common share fills exactly wastes nothing; a 190 left beside an 810 task, where only rarer small
    shares fit, wastes most of itself. The chances have two levels, so the table (and every state's
    values) changes only when a share enters, leaves or crosses COMMON, not with each new mix."""
    table = array("d", [0.0]) * (MILLI + 1)
    fitting: list[tuple[int, float]] = []  # the shares that fit, with their chances as scaled
    taken = 0.0
    for free in range(MILLI + 1):
        if len(fitting) < len(sizes) and sizes[len(fitting)][0] <= free:
            while len(fitting) < len(sizes) and sizes[len(fitting)][0] <= free:
                fitting.append(sizes[len(fitting)])
            chances = [chance for _, chance in sizes[: len(fitting)]]
            taken = sum(chances)
            if taken > 1.0:
                chances = [chance / taken for chance in chances]
                taken = 1.0
            fitting = [(size, chance) for (size, _), chance in zip(fitting, chances, strict=True)]
        if not fitting:
            table[free] = float(free)
            continue
        table[free] = sum(c * table[free - size] for size, c in fitting) + (1.0 - taken) * free
    return table


@lru_cache(maxsize=256)
def _changed_from(old: tuple[tuple[int, float], ...], new: tuple[tuple[int, float], ...]) -> int:
    """The least free part of a card whose waste differs between the two sets of shares (MILLI + 1: none).
    A share entering, leaving or changing its chance changes the table from its size on only."""
    before, after = waste_table(old), waste_table(new)
    return next((free for free in range(MILLI + 1) if before[free] != after[free]), MILLI + 1)


def _reach(free: tuple[int, ...]) -> int:
    """The highest entry of the waste table any kind's value reads for these free cards: a partial card's
    free part (or less), a whole card's remainder once filled with one share (under half a card)."""
    return max((f if f < MILLI else MILLI // 2 - 1 for f in free), default=-1)


class _Waste:
    """A waste table (`waste_table`) and the per-card-state answers computed with it: free-capacity
    vector -> (slots or 1, slots, stranded, left, the value when neither CPU nor memory holds a task
    back) per (GPUs, share), from `_cards`. Mixes of the same
    single-GPU shares share one, so the answers are shared too."""

    __slots__ = ("table", "cards")

    def __init__(self, table: array[float]) -> None:
        self.table = table
        self.cards: dict[tuple[int, ...], dict[tuple[int, int], tuple[int, int, float, float, float]]] = {}


@lru_cache(maxsize=64)
def _waste(sizes: tuple[tuple[int, float], ...]) -> _Waste:
    return _Waste(waste_table(sizes))


# Equal sets of shares and chances are one object, hashed once (`_canonical`): a state tells by identity
# whether its values were computed against a mix's shares, and the memos keyed on them (`_waste`,
# `_changed_from`) never walk the tuple. Bounded; a set met again after a clear is merely new.
_SIZES: dict[tuple[tuple[int, float], ...], HashedTuple[tuple[int, float]]] = {}


def _canonical(sizes: tuple[tuple[int, float], ...]) -> HashedTuple[tuple[int, float]]:
    found = _SIZES.get(sizes)
    if found is None:
        if len(_SIZES) >= 256:
            _SIZES.clear()
        found = _SIZES[sizes] = HashedTuple(sizes)
    return found


# Kinds of a mix that share GPUs, share and models: ((GPUs, share), models, the largest CPU and memory
# any of them needs, the members' indices, the members as (index, CPU, memory), the indices as bits).
_Group = tuple[tuple[int, int], tuple[str, ...], int, int, tuple[int, ...], tuple[tuple[int, int, int], ...], int]


def _groups(entries: tuple[tuple[int, float, _Kind], ...]) -> tuple[_Group, ...]:
    found: dict[tuple[int, int, tuple[str, ...]], list[tuple[int, int, int]]] = {}
    for index, _, (gpus, milli, _, cpu, memory, models) in entries:
        found.setdefault((gpus, milli, models), []).append((index, cpu, memory))
    return tuple(((gpus, milli), models, max(m[1] for m in members), max(m[2] for m in members),
                  tuple(m[0] for m in members), tuple(members), sum(1 << i for i in {m[0] for m in members}))
                 for (gpus, milli, models), members in found.items())


class _Registry:
    """Kinds of task -> their index in each state's vector of per-kind values.

    A state's value for one kind does not depend on the mix's weights, so a new mix (a learned mix moves
    with the pods) costs a dot product per state, not a new evaluation. Append-only; when full, the
    vectors and the registry are dropped together and compiled mixes re-index (`generation`)."""

    __slots__ = ("indices", "shares", "generation")

    def __init__(self) -> None:
        self.indices: dict[tuple[int, int, int, int, tuple[str, ...]], int] = {}
        self.shares = 0  # the indices of the single-GPU kinds (their values read the waste table), as bits
        self.generation = 0

    def index(self, kind: _Kind, drop: bool = True) -> int:
        key = (kind[0], kind[1], kind[3], kind[4], kind[5])
        found = self.indices.get(key)
        if found is None:
            if drop and len(self.indices) >= _KINDS_LIMIT:
                self.drop()
            found = self.indices[key] = len(self.indices)
            if kind[0] == 1:
                self.shares |= 1 << found
        return found

    def drop(self) -> None:
        """Forget every kind, and the vectors indexed by them; compiled mixes re-index."""
        self.indices.clear()
        self.shares = 0
        _VECTORS.clear()
        self.generation += 1


_KINDS_LIMIT = 1 << 12
_REGISTRY = _Registry()
# Per (GPU model, state): each kind's fragmentation (thousandths), NaN where not computed yet.
_VECTORS: dict[tuple[str, _State], Measured] = {}
_VECTORS_LIMIT = 1 << 17
_NAN = float("nan")


# Fragmentation by (node identity, usage, compiled mix identity, paper?); the nodes and mixes are held in
# `_HELD` so that their ids stay unique while an entry refers to them. Both are dropped together when full.
_VALUES: dict[tuple[int, NodeUsage, int, bool], tuple[float, int]] = {}
_HELD: dict[int, object] = {}
_VALUES_LIMIT = 1 << 18
# A node's state per (node identity, usage), whatever the mix: held in `_HELD` and dropped with `_VALUES`.
_STATES: dict[tuple[int, NodeUsage], _State] = {}


def forget() -> None:
    """Drop the memoised states and values (not the kinds registry): for a caller that is done with a
    cluster, so that the next one starts with small tables (a replay per seed)."""
    for memo in (_VALUES, _HELD, _STATES, _VECTORS):
        memo.clear()
    _waste.cache_clear()
    _paper_fragmentation.cache_clear()


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
    return _value(node, usage, _compiled(mix), paper)[0]


def fragmentation_delta(
    node: Node, before: NodeUsage, after: NodeUsage, mix: tuple[WorkloadShape, ...], *, paper: bool = False
) -> float:
    """How much the node's expected fragmentation grows from `before` to `after` (GPU units; lower is better).

    Includes a small best-fit term (TIE_BREAK per GPU left free) so that equal growth prefers the fuller node.
    """
    compiled = _compiled(mix)
    was, _ = _value(node, before, compiled, paper)
    now, free = _value(node, after, compiled, paper)
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
    compiled = _compiled(mix)
    return (_fragmentation(model, after, compiled) - _fragmentation(model, before, compiled)
            + TIE_BREAK * sum(after[0]) / MILLI)


class Measured:
    """One (GPU model, state): each kind's value (as long as the registry, NaN where not computed yet;
    `generation`: the registry's they are indexed by), and the expectation under the last mix asked for.
    The scorer holds these per option, so that re-weighing an option under a new mix looks nothing up."""

    __slots__ = ("model", "state", "free", "values", "generation", "known", "mix", "expected", "sizes")

    def __init__(self, model: str, state: _State) -> None:
        self.model = model
        self.state = state
        self.free = sum(state[0])  # free thousandths
        self.values = array("d", [_NAN]) * max(len(_REGISTRY.indices), 1)
        self.generation = _REGISTRY.generation
        self.known = 0  # the indices of the kinds computed, as bits
        self.mix: _Mix | None = None
        self.expected = 0.0
        self.sizes: tuple[tuple[int, float], ...] = ()  # the shares (and chances) the values were computed against


def measured(model: str, state: _State) -> Measured:
    """The state's `Measured`, shared by every option that reaches the state."""
    key = (model, state)
    found = _VECTORS.get(key)
    if found is None:
        if len(_VECTORS) >= _VECTORS_LIMIT:
            _VECTORS.clear()
        found = _VECTORS[key] = Measured(model, state)
    return found


def compiled_mix(mix: tuple[WorkloadShape, ...]) -> _Mix:
    """The mix as `expected` takes it (memoised by value; a placement context keeps its own)."""
    return _compiled(mix)


def expected(found: Measured, mix: _Mix) -> float:
    """The state's fragmentation under the mix (GPU units): `node_fragmentation`'s value."""
    if found.mix is mix:
        return found.expected
    if not found.state[0]:
        value = 0.0
    else:
        if mix.generation != _REGISTRY.generation:
            mix.indexed()
        values = found.values
        if found.generation != _REGISTRY.generation:
            # The registry was dropped (indices mean other kinds): compute again.
            values = found.values = array("d", [_NAN]) * max(len(_REGISTRY.indices), 1)
            found.generation = _REGISTRY.generation
            found.known = 0
            found.sizes = mix.sizes
        elif found.sizes is not mix.sizes:
            # The mix's shares changed, and so did what a card's remainder wastes, from some part of a card
            # on: the single-GPU kinds are computed again where they read the table that far (multi-GPU
            # kinds never read it).
            if found.known and _changed_from(found.sizes, mix.sizes) <= _reach(found.state[0]):
                found.known &= ~_REGISTRY.shares
            found.sizes = mix.sizes
        if len(values) < len(_REGISTRY.indices):
            grown = array("d", [_NAN]) * len(_REGISTRY.indices)
            grown[: len(values)] = values
            values = found.values = grown
        missing = mix.mask & ~found.known
        if missing:
            _fill(found.model, found.state, values, mix.wanted(missing), _waste(mix.sizes))
            found.known |= mix.mask
        # The weighted sum (Cost: in the docstring): a new mix re-weighs every state.
        value = sum(map(mul, mix.weights, mix.pick(values))) / MILLI
    found.mix, found.expected = mix, value
    return value


def _value(node: Node, usage: NodeUsage, mix: _Mix, paper: bool) -> tuple[float, int]:
    """(fragmentation, free thousandths) of the node in this state."""
    key = (id(node), usage, id(mix), paper)
    found = _VALUES.get(key)
    if found is not None and _HELD.get(key[0]) is node:
        return found
    measure = _paper_fragmentation if paper else _fragmentation
    state = _STATES.get(key[:2]) if _HELD.get(key[0]) is node else None
    if state is None:
        state = _state(node, usage)
    value = (measure(node.gpu_model.lower(), state, mix), sum(state[0]))
    if len(_VALUES) >= _VALUES_LIMIT:
        _VALUES.clear()
        _HELD.clear()
        _STATES.clear()
    _HELD[id(node)] = node
    _STATES[key[:2]] = state
    _HELD[id(mix)] = mix
    _VALUES[key] = value
    return value


def _compiled(mix: tuple[WorkloadShape, ...]) -> _Mix:
    return _compile(mix if mix else default_mix())


@lru_cache(maxsize=64)
def _compile(mix: tuple[WorkloadShape, ...]) -> _Mix:
    """The kinds of task that use GPUs, with weights normalised to sum to 1."""
    kept = [s for s in mix if s.gpus > 0 and s.milli > 0 and s.weight > 0]
    total = sum(s.weight for s in kept)
    return _Mix(
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


def _fragmentation(model: str, state: _State, mix: _Mix) -> float:
    """Free thousandths a task from the mix cannot use: per kind of task that shares cards, two horizons
    weighed by FILLED; per whole-card kind, the next-task one.

    Next task (the paper's view): what one more such task could not use now. Filled node: what is left
    once as many such tasks as the cards, CPU and memory allow have been placed. Each kind's value is
    kept per state (`_VECTORS`), so that a mix with other weights costs only the weighted sum.
    """
    if not state[0]:
        return 0.0
    found = _VECTORS.get((model, state))
    if found is not None and found.mix is mix:
        return found.expected
    return expected(measured(model, state), mix)


# Answers kept per waste table (`_Waste.cards`), at most this many card states each.
_CARDS_LIMIT = 1 << 15
# Whether a node model matches a kind's models (substrings), per (model, models).
_HOSTS: dict[tuple[str, tuple[str, ...]], bool] = {}


def _fill(model: str, state: _State, values: array[float], groups: tuple[_Group, ...], waste: _Waste) -> None:
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
        if models:
            hosts = _HOSTS.get((model, models))
            if hosts is None:
                hosts = _HOSTS[(model, models)] = any(m in model for m in models)
            if not hosts:
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
def _paper_fragmentation(model: str, state: _State, mix: _Mix) -> float:
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
