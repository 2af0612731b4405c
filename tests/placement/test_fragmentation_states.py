"""The scorer keeps each option's node states apart from the mix: a new mix re-weighs them, same values."""

from __future__ import annotations

from webhook.core.domain.model import Gpu, GpuUsage, Node, NodeUsage
from webhook.core.domain.request import PodRequest
from webhook.core.placement.context import PlacementContext, WorkloadShape
from webhook.core.placement.fragmentation import fragmentation_delta, node_states, states_delta
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import place

CARD = 16000


def node(name: str = "n", gpus: int = 4, cpu: int = 32000) -> Node:
    return Node(name=name, gpus=tuple(Gpu(i, f"{name}-u{i}", "A100", CARD) for i in range(gpus)),
                cpu_milli=cpu, memory_mib=262144)


def share(milli: int) -> GpuUsage:
    return GpuUsage(memory_mib=CARD * milli // 1000, cores=milli // 10, tasks=1)


MIXES = [
    (WorkloadShape(1, 500, 1.0), WorkloadShape(1, 1000, 1.0)),
    (WorkloadShape(1, 250, 3.0), WorkloadShape(2, 1000, 1.0, cpu_milli=16000)),
    (WorkloadShape(4, 1000, 1.0), WorkloadShape(1, 300, 2.0, memory_mib=100000)),
]


def test_states_delta_is_the_fragmentation_delta_under_every_mix() -> None:
    n = node()
    before = NodeUsage(gpus=(share(300), share(700), GpuUsage(), GpuUsage()), cpu_milli=8000)
    after = NodeUsage(gpus=(share(300), share(700), share(500), GpuUsage()), cpu_milli=12000)
    states = node_states(n, before, after)
    assert node_states(n, states[1], after) == states  # the state before, passed as computed once
    for mix in MIXES:
        assert states_delta(states, mix) == fragmentation_delta(n, before, after, mix)


def test_a_new_mix_changes_the_choice_without_stale_scores() -> None:
    # One node partly used, one empty: the slice goes to the used node under each mix, and after a new
    # mix the index's class memos must answer with that mix's scores (as a fresh index does), not the old.
    used = node("a")
    empty = node("b")
    index = NodeIndex.build({"a": used, "b": empty}, {
        "a": NodeUsage(gpus=(share(500), GpuUsage(), GpuUsage(), GpuUsage())),
        "b": NodeUsage(gpus=(GpuUsage(),) * 4),
    })
    request = PodRequest("ns", "p", gpus=1, memory_pct=25, cores=25)
    for mix in (MIXES[0], (WorkloadShape(4, 1000, 1.0),), MIXES[0]):
        ctx = PlacementContext(policy="fragmentation", limit=2, workload_mix=mix)
        options = place(request, index, ctx).options
        fresh = place(request, NodeIndex.build({"a": used, "b": empty}, {
            "a": NodeUsage(gpus=(share(500), GpuUsage(), GpuUsage(), GpuUsage())),
            "b": NodeUsage(gpus=(GpuUsage(),) * 4),
        }), ctx).options
        assert [(o.node, o.gpus, o.score) for o in options] == [(o.node, o.gpus, o.score) for o in fresh]
        assert options[0].node == "a"
