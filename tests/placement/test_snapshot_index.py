"""A snapshot's node index never answers for another snapshot: after a change, the next decision sees it."""

from __future__ import annotations

import dataclasses

from gpu_nodes import dgx, request

from webhook.core.domain.model import Allocation, GpuUsage, NodeUsage, Snapshot, TopologyClass
from webhook.core.placement.context import PlacementContext
from webhook.core.placement.place import place
from webhook.core.placement.state import carry_index, index_of, with_allocation, with_usage

CARD = 81559


def cluster() -> Snapshot:
    return Snapshot(nodes={n.name: n for n in (dgx("d0"), dgx("d1"))}, usage={})


def whole_node(node: str) -> Allocation:
    return Allocation(node, tuple(range(8)), 8, CARD, 100, "nvidia", "H100", TopologyClass.NVLINK, 0.0, "binpack")


def full() -> NodeUsage:
    return NodeUsage(tuple(GpuUsage(CARD, 100, 1, True) for _ in range(8)))


def best_node(snapshot: Snapshot, gpus: int = 8) -> str | None:
    best = place(request(gpus), index_of(snapshot), PlacementContext()).best
    return best.node if best is not None else None


def test_an_admitted_pod_is_seen_by_the_next_decision_and_not_by_the_base() -> None:
    base = cluster()
    first = best_node(base)
    assert first is not None
    after = with_allocation(base, "team-a", whole_node(first))
    assert index_of(after) is not index_of(base)
    assert best_node(after) not in (first, None)  # the first node is full now
    assert best_node(base) == first  # the base's own index did not change
    last = with_allocation(after, "team-a", whole_node(str(best_node(after))))
    assert best_node(last) is None  # both full: no node now


def test_a_copy_with_other_usage_never_gets_the_base_index() -> None:
    base = cluster()
    built = index_of(base)
    copy = dataclasses.replace(base, usage={"d0": full(), "d1": full()})  # shares the base's holder
    assert index_of(copy) is not built
    assert best_node(copy) is None
    assert best_node(base) is not None  # the base still answers for itself


def test_a_copy_with_other_nodes_never_gets_the_base_index() -> None:
    base = cluster()
    index_of(base)
    copy = dataclasses.replace(base, nodes={"d1": dgx("d1")})
    assert set(index_of(copy).nodes) == {"d1"}


def test_usage_follows_by_the_changed_nodes_alone() -> None:
    base = cluster()
    built = index_of(base)
    derived = with_usage(base, {"d0": full()})
    assert index_of(derived).usage("d0") == full()
    assert not any(g.memory_mib for g in built.usage("d0").gpus)  # the base's index is left as it was
    same = with_usage(base, {})
    assert index_of(same) is built  # nothing changed: the very index


def test_carry_index_skips_a_snapshot_of_other_nodes() -> None:
    base = cluster()
    index_of(base)
    other = Snapshot(nodes={"d1": dgx("d1")}, usage={})
    carry_index(base, other, {})
    assert set(index_of(other).nodes) == {"d1"}


POLICIES = ("binpack", "spread", "best-fit", "dot-product", "fewest-tasks", "fragmentation",
            {"fragmentation": 0.5, "binpack": 0.5})


def test_every_policy_sees_a_node_fill_up_or_vanish_after_its_memos_are_warm() -> None:
    # Each policy scores the same states twice (warm memos), then the chosen node fills or disappears.
    for policy in POLICIES:
        context = PlacementContext(policy=policy)
        base = cluster()
        chosen = place(request(8), index_of(base), context).best
        assert chosen is not None
        again = place(request(8), index_of(base), context).best
        assert again is not None and again.node == chosen.node
        other = ({"d0", "d1"} - {chosen.node}).pop()
        filled = with_usage(base, {chosen.node: full()})
        best = place(request(8), index_of(filled), context).best
        assert best is not None and best.node == other, policy
        gone = dataclasses.replace(base, nodes={other: base.nodes[other]})
        best = place(request(8), index_of(gone), context).best
        assert best is not None and best.node == other, policy
        both = with_usage(filled, {other: full()})
        assert place(request(8), index_of(both), context).best is None, policy
