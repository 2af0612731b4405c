"""The fragmentation measure and the policy that minimises the measure's growth."""

from __future__ import annotations

import pytest

from webhook.core.domain.model import Gpu, GpuUsage, Node, NodeUsage
from webhook.core.domain.request import PodRequest
from webhook.core.placement.context import PlacementContext, WorkloadShape
from webhook.core.placement.fragmentation import (
    COMMON,
    FILLED,
    RARE_FILL,
    TIE_BREAK,
    compiled_mix,
    default_mix,
    fragmentation_delta,
    free_milli,
    node_fragmentation,
    waste_table,
)
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import commit, place


def node(gpus: int = 2, model: str = "T4", card: int = 16000, cpu: int = 64000, memory: int = 262144) -> Node:
    return Node(
        name=f"{model}-{gpus}",
        gpus=tuple(Gpu(i, f"u{i}", model, card) for i in range(gpus)),
        cpu_milli=cpu,
        memory_mib=memory,
    )


def shared(card: int, milli: int) -> GpuUsage:
    """A card holding one task of `milli` thousandths (compute and memory in proportion)."""
    return GpuUsage(memory_mib=card * milli // 1000, cores=milli // 10, tasks=1)


WHOLE = GpuUsage(memory_mib=16000, cores=100, tasks=1, exclusive=True)


def usage(*gpus: GpuUsage, cpu: int = 0, memory: int = 0) -> NodeUsage:
    return NodeUsage(gpus=gpus, cpu_milli=cpu, memory_mib=memory)


def test_free_thousandths_take_the_scarcer_of_compute_and_memory() -> None:
    n = node(3)
    used = usage(WHOLE, GpuUsage(memory_mib=8000, cores=20, tasks=1), GpuUsage())
    assert free_milli(n, used) == (0, 500, 1000)


def test_unhealthy_cards_have_nothing_free() -> None:
    n = Node("n", gpus=(Gpu(0, "a", "T4", 16000, healthy=False), Gpu(1, "b", "T4", 16000)))
    assert free_milli(n, usage(GpuUsage(), GpuUsage())) == (0, 1000)


def test_whole_card_tasks_cannot_use_a_partly_used_card() -> None:
    n = node(2)
    state = usage(GpuUsage(), shared(16000, 810))  # free: 1000 and 190
    mix = (WorkloadShape(1, 1000),)
    assert node_fragmentation(n, state, mix) == pytest.approx(0.19)
    assert node_fragmentation(n, state, mix, paper=True) == pytest.approx(0.19)


def test_share_left_over_by_whole_numbers_of_tasks_counts() -> None:
    n = node(1)
    mix = (WorkloadShape(1, 470),)
    # Two 470s fit on a free card, leaving 60: the filled-node horizon sees it, the next-task one (the paper's)
    # does not until the card is too full. The measure weighs the two (FILLED).
    assert node_fragmentation(n, usage(GpuUsage()), mix) == pytest.approx(FILLED * 0.06)
    assert node_fragmentation(n, usage(GpuUsage()), mix, paper=True) == 0.0
    assert node_fragmentation(n, usage(shared(16000, 600)), mix) == pytest.approx(0.4)
    assert node_fragmentation(n, usage(shared(16000, 600)), mix, paper=True) == pytest.approx(0.4)


def test_cpu_limits_how_many_tasks_the_free_cards_can_still_take() -> None:
    n = node(4, cpu=32000)
    mix = (WorkloadShape(1, 500, cpu_milli=6000),)
    free = usage(GpuUsage(), GpuUsage(), GpuUsage(), GpuUsage(), cpu=8000)  # 24 cores left: four tasks, two cards
    assert node_fragmentation(n, free, mix) == pytest.approx(FILLED * 2.0 + (1 - FILLED) * 0.0)
    assert node_fragmentation(n, free, mix, paper=True) == 0.0  # one more still fits, so the paper sees none
    starved = usage(GpuUsage(), GpuUsage(), GpuUsage(), GpuUsage(), cpu=28000)
    assert node_fragmentation(n, starved, mix) == node_fragmentation(n, starved, mix, paper=True) == 4.0


def test_whole_card_kinds_keep_the_next_task_view() -> None:
    # Cards a whole-card kind's CPU would strand stay whole, for lighter kinds to take: not counted.
    n = node(4, cpu=32000)
    mix = (WorkloadShape(1, 1000, cpu_milli=12000),)
    free = usage(GpuUsage(), GpuUsage(), GpuUsage(), GpuUsage(), cpu=8000)  # 24 cores left: two tasks
    assert node_fragmentation(n, free, mix) == node_fragmentation(n, free, mix, paper=True) == 0.0
    starved = usage(GpuUsage(), GpuUsage(), GpuUsage(), GpuUsage(), cpu=24000)
    assert node_fragmentation(n, starved, mix) == 4.0
    odd = usage(WHOLE, GpuUsage(), GpuUsage(), GpuUsage())  # three free cards: one 2-GPU task, one card over
    assert node_fragmentation(n, odd, (WorkloadShape(2, 1000),)) == 0.0


def test_a_shared_card_counts_for_whole_card_kinds_as_far_as_the_shares_leave_it() -> None:
    # A card holding a 300 has 700 free: no whole-card task can take it, but 300s can (twice), leaving
    # 100. So the whole-card kind counts 100 of it, not 700; the 300s' own view adds what the filled
    # node leaves (100 on each card).
    n = node(2)
    state = usage(GpuUsage(), shared(16000, 300))
    mix = (WorkloadShape(1, 1000), WorkloadShape(1, 300))
    assert node_fragmentation(n, state, mix) == pytest.approx((0.1 + FILLED * 0.2) / 2)
    # With no share in the mix nothing fills it: all of it counts.
    assert node_fragmentation(n, state, mix[:1]) == pytest.approx(0.7)


def test_a_share_goes_where_it_leaves_what_the_shares_fill_not_to_the_fullest_card() -> None:
    # Best fit puts the 500 on the card a 300 holds (700 free), leaving 200 that neither share fits. That
    # card is no use to a whole-card task either way, but a 300 would fill it; a free card the 500 halves
    # is filled by the next 500. The policy takes a free card.
    nodes = {"a": node(2), "b": node(2)}
    nodes = {k: Node(k, v.gpus, cpu_milli=v.cpu_milli, memory_mib=v.memory_mib) for k, v in nodes.items()}
    state = {"a": usage(shared(16000, 300), GpuUsage()), "b": usage(GpuUsage(), GpuUsage())}
    index = NodeIndex.build(nodes, state)
    request = PodRequest("ns", "p", vendor="nvidia", gpus=1, cores=50, memory_pct=50, is_gpu_pod=True)
    mix = (WorkloadShape(1, 1000), WorkloadShape(1, 500), WorkloadShape(1, 300))
    best = place(request, index, PlacementContext(policy="fragmentation", workload_mix=mix)).best
    assert best is not None and (best.node, best.gpus) != ("a", (0,))
    onto_shared = fragmentation_delta(nodes["a"], state["a"], usage(shared(16000, 800), GpuUsage()), mix)
    onto_free = fragmentation_delta(nodes["b"], state["b"], usage(shared(16000, 500), GpuUsage()), mix)
    assert onto_free < onto_shared


def test_host_memory_limits_too() -> None:
    n = node(2, memory=100000)
    mix = (WorkloadShape(1, 500, memory_mib=60000),)
    # One task's memory leaves a card and a half unusable once filled; the next task still fits.
    assert node_fragmentation(n, usage(GpuUsage(), GpuUsage()), mix) == pytest.approx(FILLED * 1.5 + (1 - FILLED) * 0.0)


def test_a_kind_the_model_excludes_finds_everything_fragmented() -> None:
    n = node(2, model="P100")
    mix = (WorkloadShape(1, 1000, models=("V100M16",)),)
    assert node_fragmentation(n, usage(GpuUsage(), GpuUsage()), mix) == 2.0


def test_multi_gpu_kinds_need_that_many_free_cards() -> None:
    n = node(8, model="G2")
    mix = (WorkloadShape(8, 1000),)
    empty = usage(*[GpuUsage()] * 8)
    one_taken = usage(WHOLE, *[GpuUsage()] * 7)
    assert node_fragmentation(n, empty, mix) == 0.0
    assert node_fragmentation(n, one_taken, mix) == 7.0


def test_expectation_follows_the_mix_weights() -> None:
    n = node(1)
    state = usage(shared(16000, 600))  # 400 free
    mix = (WorkloadShape(1, 1000, weight=3.0), WorkloadShape(1, 200, weight=1.0))
    # whole cards: all 0.4 stranded (weight 3/4); 200s: two fit, nothing left (weight 1/4).
    assert node_fragmentation(n, state, mix) == pytest.approx(0.3)


def test_delta_prefers_the_card_a_share_fills_best() -> None:
    n = node(2)
    before = usage(GpuUsage(), shared(16000, 160))  # free: 1000 and 840
    mix = (WorkloadShape(1, 1000, weight=2.0), WorkloadShape(1, 810), WorkloadShape(1, 160))
    on_fresh = usage(shared(16000, 810), shared(16000, 160))
    on_partial = usage(GpuUsage(), GpuUsage(memory_mib=15680, cores=97, tasks=2))
    assert fragmentation_delta(n, before, on_partial, mix) < fragmentation_delta(n, before, on_fresh, mix)


def test_delta_breaks_ties_towards_the_fuller_node() -> None:
    n = node(2)
    mix = (WorkloadShape(1, 1000),)
    empty = usage(GpuUsage(), GpuUsage())
    half = usage(WHOLE, GpuUsage())
    full = usage(WHOLE, WHOLE)
    onto_empty = fragmentation_delta(n, empty, half, mix)
    onto_half = fragmentation_delta(n, half, full, mix)
    assert onto_empty == pytest.approx(TIE_BREAK * 1.0)
    assert onto_half == pytest.approx(0.0)
    assert onto_half < onto_empty


def test_empty_mix_means_the_default_mix() -> None:
    n = node(2)
    before, after = usage(GpuUsage(), GpuUsage()), usage(shared(16000, 300), GpuUsage())
    assert fragmentation_delta(n, before, after, ()) == fragmentation_delta(n, before, after, default_mix())
    assert {s.gpus for s in default_mix()} == {1, 2, 4, 8}


def test_fragmentation_policy_puts_a_share_where_it_fills_a_card() -> None:
    nodes = {"a": node(2), "b": node(2)}
    nodes = {k: Node(k, v.gpus, cpu_milli=v.cpu_milli, memory_mib=v.memory_mib) for k, v in nodes.items()}
    state = {"a": usage(GpuUsage(), GpuUsage()), "b": usage(shared(16000, 500), GpuUsage())}
    index = NodeIndex.build(nodes, state)
    request = PodRequest("ns", "p", vendor="nvidia", gpus=1, cores=50, memory_pct=50, is_gpu_pod=True)
    mix = (WorkloadShape(1, 1000, weight=3.0), WorkloadShape(1, 500))
    best = place(request, index, PlacementContext(policy="fragmentation", workload_mix=mix)).best
    assert best is not None and (best.node, best.gpus) == ("b", (0,))
    after = commit(index.usage("b"), best, request, nodes["b"])
    assert free_milli(nodes["b"], after) == (0, 1000)


def test_memoised_results_are_stable() -> None:
    n = node(4)
    state = usage(shared(16000, 300), GpuUsage(), WHOLE, GpuUsage())
    mix = (WorkloadShape(1, 300), WorkloadShape(1, 1000), WorkloadShape(2, 1000))
    first = node_fragmentation(n, state, mix)
    assert node_fragmentation(n, state, tuple(mix)) == first
    assert node_fragmentation(n, state, mix) == first


def _fresh(n: Node, state: NodeUsage, mix: tuple[WorkloadShape, ...]) -> float:
    import webhook.core.placement.fragmentation as fragmentation

    fragmentation.forget()
    return node_fragmentation(n, state, mix)


def test_each_kinds_value_is_kept_apart_from_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import webhook.core.placement.kinds as kinds

    n = node(4, cpu=16000)
    state = usage(shared(16000, 300), GpuUsage(), WHOLE, shared(16000, 700))
    first = (WorkloadShape(1, 300, 1.0), WorkloadShape(1, 1000, 2.0, 8000))
    second = (WorkloadShape(1, 300, 5.0), WorkloadShape(2, 1000, 1.0), WorkloadShape(1, 1000, 1.0, 8000))
    node_fragmentation(n, state, first)
    warm = node_fragmentation(n, state, second)  # reuses the first mix's kinds, computes the new one
    assert warm == pytest.approx(_fresh(n, state, second), abs=1e-12)
    # The kinds registry dropped while mixes compiled before still exist: they re-index.
    monkeypatch.setattr(kinds, "KINDS_LIMIT", 2)
    third = (WorkloadShape(1, 500, 1.0), WorkloadShape(1, 250, 1.0), WorkloadShape(4, 1000, 1.0))
    node_fragmentation(n, state, third)
    assert node_fragmentation(n, state, second) == pytest.approx(warm, abs=1e-12)
    assert node_fragmentation(n, state, first) == pytest.approx(_fresh(n, state, first), abs=1e-12)


def test_a_remainder_counts_as_far_as_the_shares_likely_to_come_fill_it() -> None:
    # An 810-milli task leaves 190 on its card. Only a 160 fits there: when 160s are common they fill it
    # (30 left, which nothing fits); when they are rare (under 1/COMMON of the sharing weight) they come
    # with a chance of RARE_FILL, and the rest of the 190 counts as lost.
    common = waste_table(((160, 1.0), (810, 1.0)))
    assert common[190] == 30.0
    rare = waste_table(((160, RARE_FILL), (810, 1.0)))
    assert rare[190] == pytest.approx(RARE_FILL * 30 + (1 - RARE_FILL) * 190)
    # Shares that fit together and pass a chance of 1 between them are drawn in proportion.
    assert waste_table(((100, 1.0), (300, 1.0)))[350] == pytest.approx((50 + 50) / 2)
    # Which level a share gets: its weight among the card-sharing kinds against 1/COMMON.
    assert compiled_mix((WorkloadShape(1, 470, weight=COMMON - 1.0), WorkloadShape(1, 160, weight=1.0))).sizes \
        == ((160, 1.0), (470, 1.0))
    assert compiled_mix((WorkloadShape(1, 470, weight=COMMON * 2.0), WorkloadShape(1, 160, weight=1.0),
                         WorkloadShape(1, 1000, weight=50.0))).sizes == ((160, RARE_FILL), (470, 1.0))
