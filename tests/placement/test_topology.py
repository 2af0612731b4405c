"""Best-connected GPU sets, topology classes and NVLink cliques on hand-built nodes."""

from __future__ import annotations

from itertools import combinations

import pytest
from gpu_nodes import dgx, paired, pcie_box, two_domains
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.domain.model import TopologyClass
from webhook.core.placement.context import DEFAULT_LOSS
from webhook.core.placement.topology import (
    LinkGraph,
    best_gpu_set,
    classify_pairs,
    could_ever_nvlink,
    expected_loss,
    largest_nvlink_clique,
    mask_of,
    topology_of,
)

ALL8 = tuple(range(8))


def test_nvswitch_sets_are_all_nvlink_and_numa_local() -> None:
    node = dgx()
    two = best_gpu_set(node, ALL8, 2)
    four = best_gpu_set(node, ALL8, 4)
    eight = best_gpu_set(node, ALL8, 8)
    assert two is not None and four is not None and eight is not None
    assert (two.gpus, two.topology, two.links) == ((0, 1), TopologyClass.NVLINK, 18)
    # Every 4-set is all-NVLink; the one on a single NUMA node (0-3) wins over e.g. 0,1,4,5.
    assert (four.gpus, four.topology, four.numa_nodes) == ((0, 1, 2, 3), TopologyClass.NVLINK, 1)
    assert (eight.gpus, eight.topology, eight.nvlink_pairs) == (ALL8, TopologyClass.NVLINK, 28)
    # With GPUs 0-2 taken, the NUMA-1 quartet is the only NUMA-local choice.
    rest = best_gpu_set(node, (3, 4, 5, 6, 7), 4)
    assert rest is not None and rest.gpus == (4, 5, 6, 7)


def test_paired_node_gives_a_bridged_pair_and_four_is_mixed() -> None:
    node = paired()
    two = best_gpu_set(node, ALL8, 2)
    assert two is not None and (two.gpus, two.topology) == ((0, 1), TopologyClass.NVLINK)
    # Free 0, 2, 3, 5: the only bridged pair among them is 2-3.
    pair = best_gpu_set(node, (0, 2, 3, 5), 2)
    assert pair is not None and (pair.gpus, pair.topology, pair.links) == ((2, 3), TopologyClass.NVLINK, 12)
    four = best_gpu_set(node, ALL8, 4)
    assert four is not None
    assert (four.gpus, four.topology, four.nvlink_pairs, four.links) == (
        (0, 1, 2, 3),
        TopologyClass.MIXED,
        2,
        24,
    )
    # Three GPUs: one bridged pair plus one more is the best a paired node can do.
    three = best_gpu_set(node, ALL8, 3)
    assert three is not None and three.topology is TopologyClass.MIXED and three.nvlink_pairs == 1


def test_no_bridged_pair_free_falls_back_to_the_closest_pcie_path() -> None:
    # 1, 2 and 4 share no bridge; 1-2 are on the same NUMA node (NODE), 2-4 and 1-4 cross it (SYS).
    found = best_gpu_set(paired(), (1, 2, 4), 2)
    assert found is not None
    assert (found.gpus, found.topology, found.pcie_cost) == ((1, 2), TopologyClass.PCIE, 4)


def test_single_gpu_leaves_bridged_pairs_intact() -> None:
    # Free 0, 1 (a pair) and 2 (its partner 3 is busy): one GPU goes to 2, keeping 0-1 for a later pair.
    found = best_gpu_set(paired(), (0, 1, 2), 1)
    assert found is not None and (found.gpus, found.topology) == ((2,), TopologyClass.SINGLE)


def test_pcie_box_only_gives_pcie_sets() -> None:
    found = best_gpu_set(pcie_box(), (0, 1, 2, 3), 2)
    assert found is not None and (found.gpus, found.topology, found.pcie_cost) == (
        (0, 1),
        TopologyClass.PCIE,
        1,
    )
    assert best_gpu_set(pcie_box(), (0, 1), 3) is None


def test_sixteen_gpu_node_stays_inside_one_nvswitch_domain() -> None:
    node = two_domains()
    eight = best_gpu_set(node, tuple(range(16)), 8)  # 12870 combinations: greedy search
    assert eight is not None and (eight.gpus, eight.topology) == (ALL8, TopologyClass.NVLINK)
    # With 0-3 busy, eight all-linked GPUs exist only in the second domain.
    second = best_gpu_set(node, tuple(range(4, 16)), 8)
    assert second is not None and (second.gpus, second.topology) == (
        tuple(range(8, 16)),
        TopologyClass.NVLINK,
    )
    four = best_gpu_set(node, (0, 1, 2, 8, 9, 10, 11), 4)
    assert four is not None and (four.gpus, four.topology) == ((8, 9, 10, 11), TopologyClass.NVLINK)


def test_largest_clique_and_ever_nvlink() -> None:
    assert largest_nvlink_clique(dgx()) == 8
    assert largest_nvlink_clique(dgx(unhealthy=(3,))) == 7
    assert largest_nvlink_clique(paired()) == 2
    assert largest_nvlink_clique(pcie_box()) == 1
    assert largest_nvlink_clique(two_domains()) == 8
    assert could_ever_nvlink(paired(), 2) and not could_ever_nvlink(paired(), 3)
    assert could_ever_nvlink(pcie_box(), 1) and not could_ever_nvlink(pcie_box(), 2)
    assert not could_ever_nvlink(dgx(unhealthy=(0,)), 8)


def test_classes_and_loss_table() -> None:
    assert classify_pairs(1, 0) is TopologyClass.SINGLE
    assert classify_pairs(3, 3) is TopologyClass.NVLINK
    assert classify_pairs(3, 1) is TopologyClass.MIXED
    assert classify_pairs(3, 0) is TopologyClass.PCIE
    assert [expected_loss(c, DEFAULT_LOSS) for c in TopologyClass] == [0.0, 0.03, 0.20, 0.375]
    assert expected_loss(TopologyClass.MIXED, {TopologyClass.MIXED: 0.15}) == 0.15
    assert LinkGraph.of_node(paired()).classify((0, 1, 4)) is TopologyClass.MIXED
    assert topology_of(paired(), (2, 3)) is TopologyClass.NVLINK
    assert topology_of(pcie_box(), (0, 1, 2)) is TopologyClass.PCIE


def _exhaustive_rank(node_links: tuple[tuple[int, ...], ...], free: tuple[int, ...], k: int) -> tuple[int, int]:
    """Best (class rank, -NVLink pairs) over every k-subset, by brute force."""
    best = (3, 0)
    for combo in combinations(free, k):
        pairs = sum(1 for a, b in combinations(combo, 2) if node_links[a][b] > 0)
        cls = classify_pairs(k, pairs)
        rank = {
            TopologyClass.SINGLE: 0,
            TopologyClass.NVLINK: 0,
            TopologyClass.MIXED: 1,
            TopologyClass.PCIE: 2,
        }
        best = min(best, (rank[cls], -pairs))
    return best


@settings(max_examples=60, deadline=None)
@given(
    free=st.sets(st.integers(0, 7), min_size=1, max_size=8),
    k=st.integers(1, 8),
    kind=st.sampled_from(["dgx", "paired", "pcie"]),
)
def test_best_set_is_as_connected_as_any_subset(free: set[int], k: int, kind: str) -> None:
    node = {"dgx": dgx(), "paired": paired(), "pcie": pcie_box()}[kind]
    free_gpus = tuple(sorted(g for g in free if g < len(node.gpus)))
    found = best_gpu_set(node, free_gpus, k)
    if len(free_gpus) < k:
        assert found is None
        return
    assert found is not None and set(found.gpus) <= set(free_gpus) and len(found.gpus) == k
    rank = {TopologyClass.SINGLE: 0, TopologyClass.NVLINK: 0, TopologyClass.MIXED: 1, TopologyClass.PCIE: 2}
    assert (rank[found.topology], -found.nvlink_pairs) == _exhaustive_rank(node.nvlink, free_gpus, k)


@pytest.mark.parametrize("gpus", [(0, 1), (2, 5, 7)])
def test_mask_round_trip(gpus: tuple[int, ...]) -> None:
    assert mask_of(gpus) == sum(1 << g for g in gpus)
