"""The cached per-kind path (values kept per state and kind, groups of kinds filled at once, the
expectation kept per state for the last mix) gives the direct computation's values under random mixes,
in any order of mixes, and the scorer's choices under a changing mix are those of a fresh index."""

from __future__ import annotations

import functools
import random

import pytest

import webhook.core.placement.fragmentation as fragmentation
import webhook.core.placement.kinds as kinds
from webhook.core.domain.model import Gpu, GpuUsage, Node, NodeUsage
from webhook.core.domain.request import PodRequest
from webhook.core.placement.context import PlacementContext, WorkloadShape
from webhook.core.placement.fragmentation import (
    COMMON,
    FILLED,
    MILLI,
    RARE_FILL,
    TIE_BREAK,
    compiled_mix,
    expected,
    fragmentation_delta,
    measured,
    node_fragmentation,
    node_state,
    node_states,
    states_delta,
)
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import commit, place

CARD = 16000
MODELS = ("A10", "T4", "V100M32")


def brute_chances(kinds: list[WorkloadShape]) -> dict[int, float]:
    """Each card-sharing share's chance of filling a remainder it fits: sure for a share of at least
    1/COMMON of those kinds' weight, RARE_FILL for a rarer one."""
    weights: dict[int, float] = {}
    for k in kinds:
        if k.gpus == 1 and k.milli < MILLI:
            weights[k.milli] = weights.get(k.milli, 0.0) + k.weight
    total = sum(weights.values())
    return {milli: 1.0 if w / total >= 1 / COMMON else RARE_FILL for milli, w in weights.items()}


def brute_waste(free: int, chances: dict[int, float]) -> float:
    """What of a card's free part the shares leave unused, by the recursion itself: each share that fits
    comes with its chance (scaled to sum to 1 where they pass it), and what none takes is lost."""
    @functools.cache
    def waste(left: int) -> float:
        fits = {s: c for s, c in chances.items() if s <= left}
        taken = sum(fits.values())
        scale = 1 / taken if taken > 1 else 1.0
        return sum(c * scale * waste(left - s) for s, c in fits.items()) + (1 - min(taken, 1.0)) * left

    return waste(free)


def brute(model: str, free: list[int], cpu: int, memory: int, mix: tuple[WorkloadShape, ...]) -> float:
    """The measure straight from its definition (module docstring), one kind at a time."""
    total = sum(free)
    if not total:
        return 0.0
    kinds = [k for k in mix if k.gpus > 0 and k.milli > 0 and k.weight > 0]
    weights = sum(k.weight for k in kinds)
    sizes = brute_chances(kinds)
    value = 0.0
    for k in kinds:
        milli = min(k.milli, MILLI)
        if k.models and not any(m.lower() in model.lower() for m in k.models):
            v = float(total)
        else:
            fitting = sum(1 for f in free if f >= milli)
            slots = sum(f // milli for f in free) if k.gpus == 1 else fitting // k.gpus
            sharing = k.gpus == 1 and milli < MILLI and fitting >= 1
            if fitting < k.gpus:
                stranded = float(total)
            elif k.gpus == 1:  # shares and whole cards alike: a card too full counts what shares leave of it
                stranded = sum(brute_waste(f, sizes) for f in free if f < milli)
            else:
                stranded = float(sum(f for f in free if f < milli))
            next_task = total if cpu < k.cpu_milli or memory < k.memory_mib else stranded
            if milli == MILLI:
                v = float(next_task)
            else:
                tasks = slots
                if k.cpu_milli:
                    tasks = min(tasks, cpu // k.cpu_milli)
                if k.memory_mib:
                    tasks = min(tasks, memory // k.memory_mib)
                if tasks == slots and sharing:
                    left = sum(brute_waste(f % milli, sizes) for f in free)
                else:
                    left = total - tasks * k.gpus * milli
                v = FILLED * left + (1 - FILLED) * next_task
        value += k.weight / weights * v
    return value / MILLI


# A small pool of kinds, so that random mixes share kinds (and groups of kinds) with earlier ones and
# the cache's partly filled vectors are exercised; CPU and memory needs around what the nodes have left.
POOL = [
    WorkloadShape(g, m, 1.0, c, r, models)
    for g, m in ((1, 110), (1, 250), (1, 470), (1, 500), (1, 810), (1, 1000), (2, 1000), (4, 1000), (8, 1000))
    for c, r in ((0, 0), (4000, 0), (16000, 30000), (48000, 100000))
    for models in ((), ("t4",), ("a10", "v100"))
]


def random_mix(rng: random.Random) -> tuple[WorkloadShape, ...]:
    kinds = rng.sample(POOL, rng.randint(1, 24))
    return tuple(WorkloadShape(k.gpus, k.milli, rng.choice((0.5, 1.0, 3.0, rng.random())), k.cpu_milli,
                               k.memory_mib, k.models) for k in kinds)


def random_node(rng: random.Random) -> tuple[Node, NodeUsage]:
    gpus = rng.choice((1, 2, 4, 8))
    model = rng.choice(MODELS)
    cpu, memory = rng.choice((32000, 64000, 96000)), rng.choice((131072, 262144))
    node = Node(name="n", gpus=tuple(Gpu(i, f"u{i}", model, CARD) for i in range(gpus)),
                cpu_milli=cpu, memory_mib=memory)
    cards = []
    for _ in range(gpus):
        milli = rng.choice((0, 0, 110, 190, 250, 470, 530, 810, 1000))
        cards.append(GpuUsage(memory_mib=CARD * milli // 1000, cores=milli // 10, tasks=1 if milli else 0,
                              exclusive=milli == 1000))
    return node, NodeUsage(gpus=tuple(cards), cpu_milli=rng.randrange(0, cpu + 1, 2000),
                           memory_mib=rng.randrange(0, memory + 1, 4096))


def test_cached_values_are_the_direct_computation_under_random_mixes() -> None:
    rng = random.Random(7)
    nodes = [random_node(rng) for _ in range(60)]
    for _ in range(40):  # each mix re-weighs the states the earlier ones filled, and fills new kinds
        mix = random_mix(rng)
        for node, use in rng.sample(nodes, 20):
            state = node_state(node, use)
            want = brute(node.gpu_model, list(state[0]), state[1], state[2], mix)
            assert node_fragmentation(node, use, mix) == pytest.approx(want, rel=1e-12, abs=1e-12)
            assert expected(measured(node.gpu_model.lower(), state), compiled_mix(mix)) == \
                node_fragmentation(node, use, mix)


def test_cached_values_do_not_depend_on_what_was_computed_before() -> None:
    # Bit for bit: the same state under the same mix, warm (after other mixes) and from empty caches.
    rng = random.Random(11)
    nodes = [random_node(rng) for _ in range(30)]
    mixes = [random_mix(rng) for _ in range(12)]
    warm = {}
    for mix in mixes:
        for i, (node, use) in enumerate(nodes):
            warm[(i, id(mix))] = node_fragmentation(node, use, mix)
    for mix in reversed(mixes):
        for i, (node, use) in enumerate(nodes):
            fragmentation.forget()
            assert node_fragmentation(node, use, mix) == warm[(i, id(mix))]


def test_a_full_registry_is_dropped_without_stale_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scorer holds states across a drop of the kinds registry: their values re-index, not misread.
    rng = random.Random(3)
    monkeypatch.setattr(kinds, "KINDS_LIMIT", 8)
    nodes = [random_node(rng) for _ in range(20)]
    held = [(node, use, measured(node.gpu_model.lower(), node_state(node, use))) for node, use in nodes]
    for _ in range(30):
        mix = random_mix(rng)
        compiled = compiled_mix(mix)
        for node, _, found in held:
            state = found.state
            assert expected(found, compiled) == pytest.approx(
                brute(node.gpu_model, list(state[0]), state[1], state[2], mix), rel=1e-12, abs=1e-12)


def test_scores_under_a_changing_mix_are_a_fresh_index_s() -> None:
    # The scorer keeps each option's states and re-weighs them for a new mix: every option's score must
    # be minus the fragmentation delta computed directly, and match a fresh index's.
    rng = random.Random(5)
    pairs = [random_node(rng) for _ in range(12)]
    nodes = {f"n{i}": Node(name=f"n{i}", gpus=n.gpus, cpu_milli=n.cpu_milli, memory_mib=n.memory_mib)
             for i, (n, _) in enumerate(pairs)}
    usage = {f"n{i}": u for i, (_, u) in enumerate(pairs)}
    index = NodeIndex.build(nodes, usage)
    requests = [PodRequest("ns", f"p{i}", gpus=g, memory_pct=p, cores=p, cpu_milli=c)
                for i, (g, p, c) in enumerate(((1, 25, 1000), (1, 47, 4000), (1, 19, 0), (2, 100, 8000)))]
    for _ in range(15):
        mix = random_mix(rng)
        ctx = PlacementContext(policy="fragmentation", limit=50, workload_mix=mix)
        for request in requests:
            options = place(request, index, ctx).options
            fresh = place(request, NodeIndex.build(nodes, usage), ctx).options
            assert [(o.node, o.gpus, o.score) for o in options] == [(o.node, o.gpus, o.score) for o in fresh]
            for option in options:
                node, before = nodes[option.node], usage[option.node]
                after = commit(before, option, request, node)
                delta = fragmentation_delta(node, before, after, mix)
                assert option.score == pytest.approx(-delta, rel=1e-12, abs=1e-12)
                assert states_delta(node_states(node, before, after), mix) == delta
                want = (brute(node.gpu_model, list(node_state(node, after)[0]), *node_state(node, after)[1:], mix)
                        - brute(node.gpu_model, list(node_state(node, before)[0]), *node_state(node, before)[1:],
                                mix)
                        + TIE_BREAK * sum(node_state(node, after)[0]) / MILLI)
                assert -option.score == pytest.approx(want, rel=1e-9, abs=1e-12)


def empty_cluster(rng: random.Random, count: int) -> tuple[dict[str, Node], dict[str, NodeUsage]]:
    """`count` random nodes (names in order), nothing placed on them."""
    made = [random_node(rng)[0] for _ in range(count)]
    nodes = {f"n{i:02}": Node(name=f"n{i:02}", gpus=n.gpus, cpu_milli=n.cpu_milli, memory_mib=n.memory_mib)
             for i, n in enumerate(made)}
    return nodes, {name: NodeUsage(gpus=tuple(GpuUsage() for _ in n.gpus)) for name, n in nodes.items()}


def test_one_node_asked_for_gives_what_ranking_every_candidate_gives() -> None:
    # For one node, no node constraints and the fragmentation policy alone, placement compares the node
    # classes on their memo entries in one pass. It must give the very rejections, eligible nodes and
    # option (node, GPUs, score, loss) that scoring and ranking every candidate give, pod after pod, as
    # nodes fill up and the mix changes, with memos warm and cold.
    rng = random.Random(17)
    nodes, usage = empty_cluster(rng, 30)
    one_pass, ranked = NodeIndex.build(nodes, usage), NodeIndex.build(nodes, usage)
    shapes = ((1, 25, 1000, ()), (1, 47, 4000, ()), (1, 81, 2000, ()), (1, 100, 8000, ()), (1, 47, 0, ("T4",)),
              (2, 100, 16000, ()), (0, 0, 6000, ()), (1, 100, 200000, ()))
    mix = random_mix(rng)
    placed = 0
    for step in range(160):
        if step % 7 == 0:
            mix = random_mix(rng)
        gpus, pct, cpu, models = rng.choice(shapes)
        request = PodRequest("ns", f"p{step}", gpus=gpus, memory_pct=pct if gpus else None,
                             cores=pct if gpus else None, cpu_milli=cpu, models_include=models)
        fast = place(request, one_pass, PlacementContext(policy="fragmentation", limit=1, workload_mix=mix))
        full = place(request, ranked, PlacementContext(policy={"fragmentation": 1.0}, limit=1, workload_mix=mix))
        assert (fast.eligible, dict(fast.rejected)) == (full.eligible, dict(full.rejected))
        assert [(o.node, o.gpus, o.memory_mib, o.cores, o.score, o.loss) for o in fast.options] == \
            [(o.node, o.gpus, o.memory_mib, o.cores, o.score, o.loss) for o in full.options]
        best = fast.best
        if best is not None and step % 4:
            usage[best.node] = commit(usage[best.node], best, request, nodes[best.node])
            one_pass.apply(best.node, usage[best.node])
            ranked.apply(best.node, usage[best.node])
            placed += 1
    assert placed > 60  # the nodes filled up along the way


def drifting_mixes(rng: random.Random, count: int) -> list[tuple[WorkloadShape, ...]]:
    """Mixes of the same shares (the kinds' values stay and only the weights move, as a learned mix's do
    between two changes of its shares), each a small step from the last, as a learned mix mostly moves:
    a light kind's weight doubled or halved, or a light kind of other CPU and memory in or out."""
    shares = [k for k in POOL if k.gpus == 1 and k.milli in (250, 470, 810) and not k.models]
    others = [k for k in POOL if k.milli == MILLI and not k.models]
    heavy = {k: 4.0 for k in rng.sample(shares, 4) + rng.sample(others, 4)}
    for milli in (250, 470, 810):  # every mix keeps each share, so its waste table stays the same
        heavy.setdefault(next(k for k in shares if k.milli == milli), 4.0)
    light = [k for k in shares + others if k not in heavy]
    kept: dict[WorkloadShape, float] = {}
    mixes = []
    for _ in range(count):
        kind = rng.choice(light)
        if kind in kept and rng.random() < 0.5:
            kept[kind] = min(0.4, max(0.05, kept[kind] * rng.choice((0.5, 2.0))))
        elif kind in kept:
            del kept[kind]
        else:
            kept[kind] = 0.1
        mixes.append(tuple(WorkloadShape(k.gpus, k.milli, w, k.cpu_milli, k.memory_mib, k.models)
                           for k, w in sorted({**heavy, **kept}.items(), key=lambda kw: repr(kw[0]))))
    return mixes


def counted_weighings(monkeypatch: pytest.MonkeyPatch, gpu_pods: bool = True) -> dict[str, int]:
    """Counts the scorer's weighings (`weighed`) by the one pass and by ranking every candidate, of every
    pod or only of those asking for no GPU."""
    import webhook.core.placement.place as place_module
    import webhook.core.placement.scoring as scoring_module

    calls = {"one pass": 0, "ranked": 0}
    weighed = scoring_module.weighed

    def counted(path: str) -> object:
        def count(*args: object) -> object:
            if gpu_pods or args[4].count == 0:  # type: ignore[attr-defined]
                calls[path] += 1
            return weighed(*args)  # type: ignore[arg-type]
        return count

    monkeypatch.setattr(place_module, "weighed", counted("one pass"))
    monkeypatch.setattr(scoring_module, "weighed", counted("ranked"))
    return calls


def test_one_node_under_a_drifting_mix_weighs_again_only_what_could_win(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under a new mix of the same shares, the one pass weighs a class again only when its bound could
    # beat the best found: the answer must stay exactly ranking every candidate's, with fewer weighings.
    calls = counted_weighings(monkeypatch)
    rng = random.Random(23)
    nodes, usage = empty_cluster(rng, 40)
    one_pass, ranked = NodeIndex.build(nodes, usage), NodeIndex.build(nodes, usage)
    shapes = ((1, 25, 1000), (1, 47, 4000), (1, 81, 2000), (1, 100, 8000), (0, 0, 6000))
    for step, mix in enumerate(drifting_mixes(rng, 150)):
        gpus, pct, cpu = shapes[step % len(shapes)]
        request = PodRequest("ns", f"p{step}", gpus=gpus, memory_pct=pct if gpus else None,
                             cores=pct if gpus else None, cpu_milli=cpu)
        fast = place(request, one_pass, PlacementContext(policy="fragmentation", limit=1, workload_mix=mix))
        full = place(request, ranked, PlacementContext(policy={"fragmentation": 1.0}, limit=1, workload_mix=mix))
        assert (fast.eligible, dict(fast.rejected)) == (full.eligible, dict(full.rejected))
        assert [(o.node, o.gpus, o.score) for o in fast.options] == [(o.node, o.gpus, o.score) for o in full.options]
        if fast.best is not None and step % 3 == 0:
            usage[fast.best.node] = commit(usage[fast.best.node], fast.best, request, nodes[fast.best.node])
            one_pass.apply(fast.best.node, usage[fast.best.node])
            ranked.apply(fast.best.node, usage[fast.best.node])
    assert 0 < calls["one pass"] < 0.7 * calls["ranked"]  # fewer classes were weighed again


def test_pods_asking_for_no_gpu_weigh_only_the_classes_that_could_win(monkeypatch: pytest.MonkeyPatch) -> None:
    # Taking CPU and memory never lowers a node's fragmentation, so a pod asking for no GPU scores at most
    # minus the best-fit term of the GPUs left free: the one pass skips a class that cannot beat the best
    # so far. The answers must stay those of ranking every candidate (GPU-less nodes, which score 0, and
    # nodes with GPUs mixed), and fewer classes are weighed.
    calls = counted_weighings(monkeypatch, gpu_pods=False)
    rng = random.Random(29)
    nodes, usage = empty_cluster(rng, 30)
    for i in range(6):  # CPU-only nodes, some small enough to fill up
        name = f"c{i}"
        nodes[name] = Node(name=name, gpus=(), cpu_milli=rng.choice((8000, 16000, 64000)), memory_mib=65536)
        usage[name] = NodeUsage()
    one_pass, ranked = NodeIndex.build(nodes, usage), NodeIndex.build(nodes, usage)
    shapes = ((0, 0, 6000), (0, 0, 30000), (1, 47, 4000), (0, 0, 2000), (1, 100, 8000), (2, 100, 16000))
    mix = random_mix(rng)
    for step in range(180):
        if step % 9 == 0:
            mix = random_mix(rng)
        gpus, pct, cpu = rng.choice(shapes)
        request = PodRequest("ns", f"p{step}", gpus=gpus, memory_pct=pct if gpus else None,
                             cores=pct if gpus else None, cpu_milli=cpu, memory_mib_host=rng.choice((0, 8192)))
        fast = place(request, one_pass, PlacementContext(policy="fragmentation", limit=1, workload_mix=mix))
        full = place(request, ranked, PlacementContext(policy={"fragmentation": 1.0}, limit=1, workload_mix=mix))
        assert (fast.eligible, dict(fast.rejected)) == (full.eligible, dict(full.rejected))
        assert [(o.node, o.gpus, o.score) for o in fast.options] == [(o.node, o.gpus, o.score) for o in full.options]
        if fast.best is not None and step % 3:
            usage[fast.best.node] = commit(usage[fast.best.node], fast.best, request, nodes[fast.best.node])
            one_pass.apply(fast.best.node, usage[fast.best.node])
            ranked.apply(fast.best.node, usage[fast.best.node])
    assert 0 < calls["one pass"] < 0.5 * calls["ranked"]


def test_a_share_changing_its_chance_refills_only_the_states_that_read_the_table_that_far(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The 810s go from common to rare: what a remainder wastes changes from 810 thousandths on only. A
    # state whose cards are all under that keeps its values; one with a card that far is filled again.
    # Either way the values are the direct computation's.
    def mix(big: float) -> tuple[WorkloadShape, ...]:
        return (WorkloadShape(1, 1000, 10.0), WorkloadShape(1, 470, 10.0), WorkloadShape(1, 810, big),
                WorkloadShape(1, 160, 1.0), WorkloadShape(2, 1000, 1.0))

    common, rare = compiled_mix(mix(10.0)), compiled_mix(mix(0.1))
    assert dict(common.sizes)[810] == 1.0 and dict(rare.sizes)[810] == RARE_FILL
    filled: list[tuple[int, ...]] = []
    fill = fragmentation._fill
    monkeypatch.setattr(fragmentation, "_fill", lambda model, state, *rest: filled.append(state[0]) or fill(
        model, state, *rest))
    small, large = ((470, 300, 190), 64000, 262144), ((1000, 900, 190), 64000, 262144)
    held = {state: measured("t4", state) for state in (small, large)}  # as the scorer holds them
    for state in (small, large):
        expected(held[state], common)
    filled.clear()
    values = {state: expected(held[state], rare) for state in (small, large)}
    assert filled == [large[0]]
    fragmentation.forget()
    fresh = {state: expected(measured("t4", state), rare) for state in (small, large)}
    assert values == fresh
