"""In a weighted mix of policies, every policy scores the GPUs the pod will get, whatever the names."""

from __future__ import annotations

from gpu_nodes import pcie_box, request

from webhook.core.domain.model import GpuUsage, Node, NodeUsage, Option
from webhook.core.domain.request import PodRequest
from webhook.core.placement.context import PlacementContext
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import place

CARD = 15360  # a T4


def placed(scorer_name: str) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The GPUs of the best option, and the GPUs a custom scorer named `scorer_name` was shown."""
    shown: list[tuple[int, ...]] = []

    def watcher(request: PodRequest, node: Node, usage: NodeUsage, option: Option) -> float:
        shown.append(option.gpus)
        return 0.0

    half = GpuUsage(CARD // 2, 50, 1, False)
    usage = {"t4": NodeUsage((half, GpuUsage(), GpuUsage(), GpuUsage()))}
    index = NodeIndex.build({"t4": pcie_box("t4")}, usage)
    ctx = PlacementContext(policy={"fragmentation": 1.0, scorer_name: 1.0}, gpu_policy="spread",
                           scorers={scorer_name: watcher})
    best = place(request(1, memory_mib=CARD // 4, cores=25), index, ctx).best
    assert best is not None
    return best.gpus, shown


def test_a_scorer_named_before_or_after_fragmentation_is_shown_the_gpus_the_pod_gets() -> None:
    first, shown_first = placed("a-scorer")  # sorts before "fragmentation"
    last, shown_last = placed("z-scorer")  # sorts after it
    assert first == last
    assert shown_first == shown_last == [first]
