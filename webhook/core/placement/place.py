"""Node and GPU choice: which nodes could ever host a GPU pod, and which host it best now.

Policies: random, best-fit, dot-product, binpack, spread, fewest-tasks, fragmentation, custom scorers
(registered by name in `PlacementContext.scorers`), and weighted combinations ({"binpack": 1,
"fragmentation": 2}). Multi-GPU pods go to the best-connected free GPU set first (topology).

Cost: work is done per class of equivalent nodes (see nodeindex), so a decision costs about the same on
a thousand nodes as on a hundred; the classes that can host the pod now are found in candidates.py, with
their memos looked up inline. For one node under the fragmentation policy alone (the simulator's case),
a class whose fragmentation memo entry is current is compared on its score as the loop meets it, never
made a candidate (`_best_by_fragmentation`; `_place_on_host` likewise). None changes an answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.domain.model import Node, NodeUsage, Option, Placement, TopologyClass
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.vendor_table import COUNT_RESOURCES
from webhook.core.podspec.view import EMPTY_POD, view_for

from .candidates import candidates
from .context import PlacementContext
from .fitting import Choice, Demand, Fit, choose_gpus, demand_of, static_verdict
from .fragmentation import MILLI, TIE_BREAK
from .nodeconstraints import NodeConstraints, Toleration, constraints_of, tolerations_of
from .nodeindex import NodeIndex, Shape, taken
from .nodereach import ShapeReach, count_rejections, reach_of
from .ranking import best_options, random_options
from .scoring import Candidate, fragmentation_memo, option_of, score_all, weighed
from .topology import expected_loss

_ELIGIBLE_MEMO = 256



def constraints_for(request: PodRequest, tolerations: tuple[Mapping[str, Any], ...] = ()) -> NodeConstraints:
    """The pod's node constraints with the tolerations the mutation will add to it: the vendor's device
    taint and the policy's `tolerations`. Parsed once per request (kept in `request.derived`): a server
    calls this before its plan lock, so that `place` under the lock finds them parsed."""
    return _parsed(request, _added(request.vendor, tolerations))


def parse_ahead(request: PodRequest, tolerations: tuple[Mapping[str, Any], ...] = ()) -> None:
    """`constraints_for`, for a pod that states node constraints of its own (placement shares one value
    among those that state none): a server calls this before its plan lock."""
    if states_constraints(request):
        constraints_for(request, tolerations)


def states_constraints(request: PodRequest) -> bool:
    """Whether the pod states a node selector, node affinity or tolerations of its own."""
    view = view_for(request)
    return bool(view.node_selector or view.affinity or view.tolerations)


def _parsed(request: PodRequest, added: tuple[Toleration, ...]) -> NodeConstraints:
    derived = request.derived
    if derived is None:
        derived = {}
        object.__setattr__(request, "derived", derived)  # frozen, but this field is a cache of `raw`
    found: NodeConstraints | None = derived.get(added)
    if found is None:
        found = derived[added] = constraints_of(view_for(request), added)
    return found


def _added(vendor: str, tolerations: tuple[Mapping[str, Any], ...]) -> tuple[Toleration, ...]:
    gpu_taint = _GPU_TAINTS.get(vendor) or _GPU_TAINTS[""]
    return (gpu_taint, *tolerations_of(tolerations)) if tolerations else (gpu_taint,)


# The toleration of each vendor's device taint, which the mutation adds to every GPU pod.
_GPU_TAINTS = {vendor: Toleration(resource, "Exists", "", "NoSchedule")
               for vendor, resource in {**COUNT_RESOURCES, "": "nvidia.com/gpu"}.items()}


def _constraints(request: PodRequest, ctx: PlacementContext) -> NodeConstraints:
    """constraints_for, with the added tolerations parsed once per context and vendor, and one value
    shared by the pods that state no constraint of their own."""
    found = ctx.plain.get(request.vendor)
    if found is None:
        added = _added(request.vendor, ctx.tolerations)
        found = ctx.plain[request.vendor] = (added, constraints_of(EMPTY_POD, added))
    return _parsed(request, found[0]) if states_constraints(request) else found[1]


def _best_by_fragmentation(index: NodeIndex, demand: Demand, ctx: PlacementContext, rejected: dict[str, int],
                           eligible: list[str] | None) -> Candidate | None:
    """The best node class for one node under the fragmentation policy alone, for a pod with no node
    constraints, UUIDs or topology ranking: `_candidates` and the scorer in one pass (the same rejections,
    eligible nodes and answer as `_ranked` over `_candidates`, which the tests hold equal). A class whose
    memo entry is current is compared on its score alone, never made a candidate: most classes are. One
    weighed under an earlier mix is weighed again only if it could still be the best (`_Leader.put_off`)."""
    statics = index.statics
    token = statics.token(demand.key)
    gpu_policy = demand.gpu_policy or ctx.gpu_policy
    placing, compiled = fragmentation_memo(demand, ctx, statics.token)
    leader = _Leader(compiled)
    moves, later = leader.moves, leader.later
    for shape in statics.shapes:
        verdict = static_verdict(shape, demand)
        if isinstance(verdict, str):
            rejected[verdict] = rejected.get(verdict, 0) + len(shape.names)
            continue
        if eligible is not None:
            eligible.extend(shape.names)
        first = verdict.first_bucket
        allowed = verdict.allowed
        key = (token, allowed, gpu_policy)  # choose_gpus' memo key
        entry_key = (placing, allowed)  # the fragmentation memo's
        for node_class in index.classes(shape, first):
            state = node_class.state
            memo = state.memo
            entry = memo.fragmentation.get(entry_key)
            if entry is not None:
                # `_Leader.offer` and `put_off` inline, as far as most classes go: they lose to the best.
                old = entry[0]
                if old is compiled:
                    if entry[1] >= leader.floor:
                        leader.offer(entry, state, node_class.names, verdict)
                    continue
                moved = moves.get(old)
                if moved is None:
                    moved = leader.moved(old)
                if moved != _UNBOUNDED:  # its GPUs fitted when it was weighed: weighed at the end if it could win
                    bound = entry[1] + moved * entry[3].free + _SLACK
                    if bound >= leader.floor:
                        later.append((bound, entry, state, node_class.names, verdict, entry_key))
                    continue
            # Not weighed yet, or under a mix too far off for a bound: weighed now.
            choice = memo.choices.get(key)
            if choice is None:
                choice = choose_gpus(state, verdict, allowed, demand, gpu_policy, token)
            if isinstance(choice, str):
                rejected[choice] = rejected.get(choice, 0) + len(node_class.names)
                continue
            entry = weighed(Candidate(state, node_class.names, choice, verdict, allowed), entry_key, entry,
                            compiled, demand)
            leader.offer(entry, state, node_class.names, verdict)
        busy = index.count_below(shape, first)
        if busy:
            rejected["busy"] = rejected.get("busy", 0) + busy
    return leader.settled(demand)


class _Leader:
    """The one-pass loops' best class so far (highest score, then first name), and the classes whose memo
    entry was weighed under an earlier mix, put off until the best is known: one is weighed again only
    if its bound could still beat the best."""

    __slots__ = ("compiled", "best", "floor", "later", "moves")

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.best: Candidate | None = None
        self.floor = -_UNBOUNDED  # the best's score: a class scoring less loses
        self.later: list[tuple[float, Any, Any, tuple[str, ...], Fit, tuple[int, int]]] = []
        self.moves: dict[Any, float] = {}  # earlier mix -> `distance` per thousandth free

    def offer(self, entry: Any, state: Any, names: tuple[str, ...], fit: Fit) -> None:
        """A class with its exact memo entry under the mix."""
        best, score = self.best, entry[1]
        if best is None or score > best.score or (score == best.score and names[0] < best.names[0]):
            self.best = Candidate(state, names, entry[2], fit, fit.allowed, 0.0, score)
            self.floor = score

    def moved(self, old: Any) -> float:
        """How far a class's growth can move per free thousandth from mix `old` to this one (`put_off`)."""
        found: float = self.compiled.distance(old) / MILLI
        self.moves[old] = found
        return found

    def beaten(self, top: float, names: tuple[str, ...]) -> bool:
        """Whether a class that scores at most `top` cannot beat the best so far."""
        best = self.best
        return top < self.floor or (best is not None and top == self.floor and names[0] > best.names[0])

    def put_off(self, entry: Any, state: Any, names: tuple[str, ...], fit: Fit, key: tuple[int, int]) -> bool:
        """Keep a class weighed under an earlier mix for `settled`, unless its bound is already below the
        best; False where no bound holds (weigh it now).

        The bound: each kind's value lies between 0 and the free capacity before, so the growth moves by
        at most the weights' change (`distance`) times that capacity; no bound where the kinds' values
        differ between the mixes too (other shares)."""
        moved = self.moves.get(entry[0])
        if moved is None:
            moved = self.moved(entry[0])
        if moved == _UNBOUNDED:
            return False
        bound = entry[1] + moved * entry[3].free + _SLACK
        if bound >= self.floor:  # else its score under this mix is below the best's
            self.later.append((bound, entry, state, names, fit, key))
        return True

    def settled(self, demand: Demand) -> Candidate | None:
        """The best class, once the put-off ones that could still beat it are weighed."""
        for bound, entry, state, names, fit, key in self.later:
            if bound < self.floor:
                continue
            entry = weighed(Candidate(state, names, entry[2], fit, fit.allowed), key, entry, self.compiled, demand)
            self.offer(entry, state, names, fit)
        return self.best


def _one_pass(ctx: PlacementContext, reach: ShapeReach | None) -> bool:
    """Whether node classes may be compared as they are met, not ranked: one node asked for, the
    fragmentation policy alone, and no node constraints to weigh preferred terms or narrow the classes."""
    return ctx.limit == 1 and ctx.policy == "fragmentation" and "fragmentation" not in ctx.scorers and reach is None


# Rounding in a score computed under one mix is far below this; a bound is widened by it.
_SLACK = 1e-9
_UNBOUNDED = float("inf")


# -- the decision -------------------------------------------------------------------------------


def place(request: PodRequest, index: NodeIndex, ctx: PlacementContext) -> Placement:
    """Eligible nodes, and the best options now, for a pod.

    A pod asking for no GPU takes CPU and memory only. One that names a GPU resource but asks for none of
    it (`nvidia.com/gpu: 0`, `is_gpu_pod`) gets no option: admission reports it as unsatisfiable.

    Reasons counted in `rejected`: the pod's own constraints ("node-selector", "node-affinity", "taint",
    "unschedulable": cordoned), never possible on the node ("vendor", "gpu-count", "model" (also the
    namespace's allowedModels), "unhealthy", "cores", "memory", "cpu", "host-memory", "topology", "uuid")
    or not now ("busy": too little free GPU capacity or no all-NVLink set free; "cpu", "host-memory": taken).
    """
    constraints = _constraints(request, ctx)
    demand = demand_of(request, ctx.allowed_models, constraints.cordon_ok)
    reach = reach_of(index.statics, constraints)
    if demand.count <= 0:
        if request.is_gpu_pod:
            return Placement(eligible=(), options=(), rejected={})
        return _place_on_host(request, demand, index, ctx, reach, constraints)
    rejected: dict[str, int] = {}
    # Eligibility depends on nothing that changes between index versions: computed once per demand.
    memo = index.statics.eligible
    key = (demand.key, demand.uuids_include, demand.uuids_exclude, constraints)
    eligible = memo.get(key)
    collected: list[str] | None = [] if eligible is None else None
    topology_first = demand.count > 1 and demand.topology_aware
    if _one_pass(ctx, reach) and not topology_first and not demand.uuids_include and not demand.uuids_exclude:
        found = _best_by_fragmentation(index, demand, ctx, rejected, collected)
        if eligible is None:
            assert collected is not None
            eligible = _remember(memo, key, collected)
        options: tuple[Option, ...] = (option_of(found, found.names[0], ctx),) if found is not None else ()
        return Placement(eligible=eligible, options=options, rejected=rejected)
    cands = candidates(index, demand, ctx, rejected, collected, reach)
    if eligible is None:
        assert collected is not None
        eligible = _remember(memo, key, collected)
    if demand.count > 1:  # one GPU is always SINGLE: the options' losses come with them (scoring.option_of)
        for cand in cands:
            cand.loss = expected_loss(cand.choice.topology, ctx.topology_loss)
    options = _ranked(cands, topology_first, request, demand, index, ctx, reach)
    return Placement(eligible=eligible, options=options, rejected=rejected)


def _remember(memo: dict[Any, tuple[str, ...]], key: Any, collected: list[str]) -> tuple[str, ...]:
    """Store an eligible set in the statics' memo (dropped whole when full); returns it sorted."""
    if len(memo) >= _ELIGIBLE_MEMO:
        memo.clear()
    eligible = memo[key] = tuple(sorted(collected))
    return eligible


def _ranked(cands: list[Candidate], topology_first: bool, request: PodRequest, demand: Demand, index: NodeIndex,
            ctx: PlacementContext, reach: ShapeReach | None) -> tuple[Option, ...]:
    """The best options among the candidates, by the context's policy; the pod's preferred node affinity
    breaks ties between equal scores (the weights of the terms a node meets, summed as the scheduler's
    NodeAffinity score does)."""
    if ctx.policy == "random":
        return tuple(random_options(cands, topology_first, ctx))
    score_all(cands, request, demand, ctx, index.nodes, index.statics.token)
    return tuple(best_options(cands, topology_first, ctx, reach if reach is not None and reach.weights else None))


def _place_on_host(request: PodRequest, demand: Demand, index: NodeIndex, ctx: PlacementContext,
                   reach: ShapeReach | None, constraints: NodeConstraints) -> Placement:
    """A pod asking for no GPU: any schedulable node with room for its CPU and memory, GPU-less ones too.

    Scored by the same policy as GPU pods (the fragmentation policy sees the node's growth in
    fragmentation from the CPU and memory taken).
    """
    rejected: dict[str, int] = {}
    memo = index.statics.eligible
    key = ("host", demand.key, constraints)
    eligible = memo.get(key)
    collected: list[str] = []
    cands: list[Candidate] = []
    no_gpu_loss = expected_loss(_NO_GPU.topology, ctx.topology_loss)
    # One node under the fragmentation policy alone: classes are compared on their memo entries as they
    # come (as in `_best_by_fragmentation`), not made candidates and ranked.
    one_pass = _one_pass(ctx, reach)
    placing, compiled = fragmentation_memo(demand, ctx, index.statics.token) if one_pass else (0, None)
    entry_key = (placing, 0)
    leader = _Leader(compiled)
    for shape in index.statics.shapes:
        node = shape.template
        reachable = reach.names.get(shape.number) if reach is not None else None  # None: all
        if reachable is not None:
            count_rejections(reach, shape, rejected)
            if not reachable:
                continue
        reason = _host_verdict(node, demand)
        if reason:
            rejected[reason] = rejected.get(reason, 0) + (len(shape.names) if reachable is None else len(reachable))
            continue
        collected.extend(shape.names if reachable is None else reachable)
        if one_pass:
            _host_classes(index, shape, demand, leader, entry_key, rejected)
            continue
        for node_class in index.classes(shape):
            state = node_class.state
            names = node_class.names
            if reachable is not None:
                assert reach is not None
                names = reach.within(names, reachable)
                if not names:
                    continue
            if node.cpu_milli > 0 and state.free_cpu < demand.cpu:
                rejected["cpu"] = rejected.get("cpu", 0) + len(names)
            elif node.memory_mib > 0 and state.free_memory < demand.host_memory:
                rejected["host-memory"] = rejected.get("host-memory", 0) + len(names)
            else:
                cands.append(Candidate(state, names, _NO_GPU, _NO_FIT, 0, no_gpu_loss))
    if eligible is None:
        eligible = _remember(memo, key, collected)
    if one_pass:
        best = leader.settled(demand)
        options: tuple[Option, ...] = (option_of(best, best.names[0], ctx),) if best is not None else ()
    else:
        options = _ranked(cands, False, request, demand, index, ctx, reach)
    return Placement(eligible=eligible, options=options, rejected=rejected)


def _host_classes(index: NodeIndex, shape: Shape, demand: Demand, leader: _Leader, entry_key: tuple[int, int],
                  rejected: dict[str, int]) -> None:
    """`_place_on_host`'s loop over a shape's classes for the one-pass case (every node reachable): most
    classes lose at a glance, so the test that they do is inline."""
    node = shape.template
    cpu = demand.cpu if node.cpu_milli > 0 else 0
    memory = demand.host_memory if node.memory_mib > 0 else 0
    compiled = leader.compiled
    short_cpu = short_memory = 0
    for node_class in index.classes(shape):
        state = node_class.state
        if state.free_cpu < cpu:
            short_cpu += len(node_class.names)
            continue
        if state.free_memory < memory:
            short_memory += len(node_class.names)
            continue
        memo = state.memo
        before = memo.before
        if before is not None:
            # Taking CPU and memory never lowers fragmentation: the tie-break on the free GPUs is the most
            # this class can score (`_Leader.beaten`).
            top = -(TIE_BREAK * before.free / MILLI)
            if top < leader.floor:
                continue
            best = leader.best
            if top == leader.floor and best is not None and node_class.names[0] > best.names[0]:
                continue
        names = node_class.names
        entry = memo.fragmentation.get(entry_key)
        if entry is not None and entry[0] is not compiled and leader.put_off(entry, state, names, _NO_FIT, entry_key):
            continue
        if entry is None or entry[0] is not compiled:
            entry = weighed(Candidate(state, names, _NO_GPU, _NO_FIT, 0), entry_key, entry, compiled, demand)
        leader.offer(entry, state, names, _NO_FIT)
    if short_cpu:
        rejected["cpu"] = rejected.get("cpu", 0) + short_cpu
    if short_memory:
        rejected["host-memory"] = rejected.get("host-memory", 0) + short_memory


def _host_verdict(node: Node, demand: Demand) -> str:
    """Why a node could never host a pod asking for no GPU ("" when it could)."""
    if node.unschedulable and not demand.cordon_ok:
        return "unschedulable"
    if 0 < node.cpu_milli < demand.cpu:
        return "cpu"
    if 0 < node.memory_mib < demand.host_memory:
        return "host-memory"
    return ""


_NO_GPU = Choice(gpus=(), memory=0, cores=0, topology=TopologyClass.SINGLE)
_NO_FIT = Fit(allowed=0, memory=(), cores=(), first_bucket=0)


def commit(usage: NodeUsage, option: Option, request: PodRequest, node: Node) -> NodeUsage:
    """The node's usage after hosting `request` as `option` says (no GPU in the option: CPU and memory only)."""
    return taken(node, usage, option.gpus, option.memory_mib, option.cores, not request.shared,
                 request.cpu_milli, request.memory_mib_host)
