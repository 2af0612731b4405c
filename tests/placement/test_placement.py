"""Node and GPU choice on small hand-built clusters: filters, policies, topology, commit, the index."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from gpu_nodes import A100, dgx, paired, pcie_box, request

from webhook.core.domain.model import GpuUsage, Node, NodeUsage, Option, Snapshot, TopologyClass
from webhook.core.domain.request import PodRequest
from webhook.core.domain.request import TopologyPreference as Topo
from webhook.core.placement.context import PlacementContext, WorkloadShape
from webhook.core.placement.fragmentation import FILLED, TIE_BREAK, default_mix, fragmentation_delta
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import commit, place
from webhook.core.placement.state import index_of

H100_CARD = 81559


def cluster(*nodes: Node) -> dict[str, Node]:
    return {n.name: n for n in nodes}


def nodes_of(options: tuple[Option, ...]) -> list[str]:
    return [o.node for o in options]


def held(card: int) -> GpuUsage:
    return GpuUsage(card, 100, 1, True)


# -- topology ---------------------------------------------------------------------------------------------


def test_two_gpus_on_a_paired_node_get_bridged_pairs_in_turn() -> None:
    node = paired("p")
    index = NodeIndex.build(cluster(node), {})
    usage = index.usage("p")
    chosen = []
    for _ in range(3):
        best = place(request(2), index, PlacementContext()).best
        assert best is not None and best.topology is TopologyClass.NVLINK and best.loss == 0.03
        chosen.append(best.gpus)
        usage = commit(usage, best, request(2), node)
        index.apply("p", usage)
    assert chosen == [(0, 1), (2, 3), (4, 5)]


def test_four_gpus_prefer_nvswitch_over_paired_unless_topology_is_none() -> None:
    nodes = cluster(paired("a-paired"), dgx("b-dgx"))
    index = NodeIndex.build(nodes, {})
    found = place(request(4), index, PlacementContext()).options
    assert [(o.node, o.gpus, o.topology, o.loss) for o in found] == [
        ("b-dgx", (0, 1, 2, 3), TopologyClass.NVLINK, 0.03),
        ("a-paired", (0, 1, 2, 3), TopologyClass.MIXED, 0.20),
    ]
    # Without a topology preference both idle nodes score the same and the name decides.
    blind = place(request(4, topology=Topo.NONE), index, PlacementContext()).options
    assert nodes_of(blind) == ["a-paired", "b-dgx"]
    custom = place(request(4), index, PlacementContext(topology_loss={TopologyClass.MIXED: 0.15})).options
    assert [o.loss for o in custom] == [0.0, 0.15]  # NVLINK absent from the table: 0


def test_required_topology_on_pcie_only_cluster_has_no_eligible_node() -> None:
    index = NodeIndex.build(cluster(pcie_box("t1"), pcie_box("t2")), {})
    found = place(request(2, topology=Topo.REQUIRED), index, PlacementContext())
    assert (found.eligible, found.options, dict(found.rejected)) == ((), (), {"topology": 2})
    # One GPU needs no link: required is satisfied anywhere.
    assert place(request(1, topology=Topo.REQUIRED), index, PlacementContext()).eligible == ("t1", "t2")


def test_required_topology_counts_only_nvlink_cliques() -> None:
    index = NodeIndex.build(cluster(paired("p"), dgx("d")), {"d": NodeUsage((held(H100_CARD),) * 7 + (GpuUsage(),))})
    pair = place(request(2, topology=Topo.REQUIRED), index, PlacementContext())
    assert pair.eligible == ("d", "p") and nodes_of(pair.options) == ["p"]
    assert dict(pair.rejected) == {"busy": 1}
    four = place(request(4, topology=Topo.REQUIRED), index, PlacementContext())
    assert four.eligible == ("d",) and four.options == () and dict(four.rejected) == {"topology": 1, "busy": 1}


# -- every policy on one tiny cluster ---------------------------------------------------------------------


def policy_cluster() -> tuple[dict[str, Node], dict[str, NodeUsage]]:
    """a: DGX with 6 of 8 GPUs held (3 pods); b: DGX with two 10 % slices on GPU 0; c: T4 box, one 50 % slice,
    its CPU nearly used up."""
    nodes = cluster(dgx("a"), dgx("b"), pcie_box("c"))
    usage = {
        "a": NodeUsage((held(H100_CARD),) * 6 + (GpuUsage(),) * 2, cpu_milli=48_000, gpu_tasks=3),
        "b": NodeUsage((GpuUsage(16311, 20, 2),) + (GpuUsage(),) * 7, cpu_milli=4_000, gpu_tasks=2),
        "c": NodeUsage((GpuUsage(7680, 50, 1),) + (GpuUsage(),) * 3, cpu_milli=28_000, gpu_tasks=1),
    }
    return nodes, usage


QUARTER = request(1, memory_pct=25, cores=25, cpu_milli=2_000)


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        # GPU units in use per healthy GPU: a 6/8, c 0.5/4, b 0.2/8.
        ("binpack", ["a", "c", "b"]),
        ("spread", ["b", "c", "a"]),
        # Running GPU pods: c 1, b 2, a 3.
        ("fewest-tasks", ["c", "b", "a"]),
        # Half CPU left + half GPU left after placement: c 0.0625/0.8125, a 0.74/0.22, b 0.97/0.94.
        ("best-fit", ["c", "a", "b"]),
        # Free x requested, CPU and GPU: a 0.0078+0.0078, b 0.0102+0.0305, c 0.0078+0.0547 (smallest first).
        ("dot-product", ["a", "b", "c"]),
    ],
)
def test_each_policy_orders_the_tiny_cluster(policy: str, order: list[str]) -> None:
    nodes, usage = policy_cluster()
    found = place(QUARTER, NodeIndex.build(nodes, usage), PlacementContext(policy=policy))
    assert nodes_of(found.options) == order
    assert found.eligible == ("a", "b", "c") and dict(found.rejected) == {}


def test_gpu_choice_inside_the_node_follows_gpu_policy() -> None:
    nodes, usage = policy_cluster()
    index = NodeIndex.build(nodes, usage)
    packed = {o.node: o.gpus for o in place(QUARTER, index, PlacementContext(policy="spread")).options}
    spread = {o.node: o.gpus for o in place(QUARTER, index, PlacementContext(gpu_policy="spread")).options}
    assert packed == {"a": (6,), "b": (0,), "c": (0,)}
    assert spread == {"a": (6,), "b": (1,), "c": (1,)}
    pod_says = {
        o.node: o.gpus for o in place(_with(QUARTER, gpu_placement="spread"), index, PlacementContext()).options
    }
    assert pod_says == spread
    best = place(QUARTER, index, PlacementContext()).best
    assert best is not None and (best.memory_mib, best.cores, best.topology) == (
        20389,
        25,
        TopologyClass.SINGLE,
    )


def test_fragmentation_policy_follows_the_fragmentation_measure() -> None:
    nodes, usage = policy_cluster()
    index = NodeIndex.build(nodes, usage)
    found = place(QUARTER, index, PlacementContext(policy="fragmentation", limit=3)).options
    by_node = {o.node: o for o in found}
    deltas = {
        name: fragmentation_delta(nodes[name], usage[name], commit(usage[name], o, QUARTER, nodes[name]), default_mix())
        for name, o in by_node.items()
    }
    assert nodes_of(found) == sorted(deltas, key=lambda n: (deltas[n], n))
    assert [o.score for o in found] == [-deltas[n] for n in nodes_of(found)]


def test_weighted_combinations_normalise_each_policy() -> None:
    nodes, usage = policy_cluster()
    index = NodeIndex.build(nodes, usage)
    assert nodes_of(place(QUARTER, index, PlacementContext(policy={"binpack": 1, "spread": 3})).options) == [
        "b",
        "c",
        "a",
    ]
    assert nodes_of(place(QUARTER, index, PlacementContext(policy={"binpack": 3, "spread": 1})).options) == [
        "a",
        "c",
        "b",
    ]


def test_custom_scorer_by_name_and_unknown_policy() -> None:
    nodes, usage = policy_cluster()
    index = NodeIndex.build(nodes, usage)
    seen: list[tuple[str, tuple[int, ...]]] = []

    def prefer_t4(req: PodRequest, node: Node, used: NodeUsage, option: Option) -> float:
        seen.append((node.gpu_model, option.gpus))
        return 1.0 if "T4" in node.gpu_model else 0.0

    found = place(QUARTER, index, PlacementContext(policy="prefer-t4", scorers={"prefer-t4": prefer_t4}))
    assert nodes_of(found.options) == ["c", "a", "b"]
    assert [o.score for o in found.options] == [1.0, 0.0, 0.0]
    assert sorted(seen) == [
        ("NVIDIA-H100-80GB-HBM3", (0,)),
        ("NVIDIA-H100-80GB-HBM3", (6,)),
        ("Tesla-T4", (0,)),
    ]
    with pytest.raises(ValueError, match="unknown placement policy 'tetris'"):
        place(QUARTER, index, PlacementContext(policy="tetris"))


def test_random_policy_is_deterministic_per_seed() -> None:
    nodes = cluster(*(dgx(f"n{i}") for i in range(6)))
    index = NodeIndex.build(nodes, {})
    draws = {
        seed: nodes_of(place(request(1), index, PlacementContext(policy="random", seed=seed)).options)
        for seed in range(8)
    }
    assert all(sorted(set(d)) == sorted(d) and len(d) == 5 for d in draws.values())
    assert draws[3] == nodes_of(place(request(1), index, PlacementContext(policy="random", seed=3)).options)
    assert len({d[0] for d in draws.values()}) > 1


# -- filters ----------------------------------------------------------------------------------------------


def filter_cluster() -> NodeIndex:
    nodes = cluster(
        dgx("d"),
        paired("p"),
        pcie_box("t"),
        Node("cpu-only", cpu_milli=64_000, memory_mib=256_000),
        Node("cordoned", dgx("cordoned").gpus, dgx().nvlink, dgx().pcie, unschedulable=True, cpu_milli=1),
    )
    return NodeIndex.build(nodes, {})


def _with(req: PodRequest, **changes: object) -> PodRequest:
    from dataclasses import replace

    return replace(req, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("req", "eligible", "rejected"),
    [
        (request(1, models_include=("a100",)), ("p",), {"model": 2}),
        (request(1, models_exclude=("H100", "t4")), ("p",), {"model": 2}),
        (request(1, memory_mib=50_000), ("d",), {"memory": 2}),
        (request(1, memory_pct=50, cores=50), ("d", "p", "t"), {}),
        (request(1, memory_mib=1024, cores=150), (), {"cores": 3}),
        (request(1, cpu_milli=100_000), ("d",), {"cpu": 2}),
        (request(1, memory_mib_host=1_500_000), ("d",), {"host-memory": 2}),
        (request(5), ("d", "p"), {"gpu-count": 1}),
        (request(1, uuids_include=("GPU-p-3",)), ("p",), {"uuid": 2}),
        (request(4, uuids_exclude=("GPU-t-0",)), ("d", "p"), {"uuid": 1}),
        # GPUs 1 and 2 of the paired node are on different bridges: no all-NVLink pair among them.
        (request(2, topology=Topo.REQUIRED, uuids_include=("GPU-p-1", "GPU-p-2")), (), {"uuid": 1, "topology": 2}),
        (request(2, topology=Topo.REQUIRED, uuids_include=("GPU-p-2", "GPU-p-3")), ("p",), {"uuid": 1, "topology": 1}),
        (_with(request(1), vendor="hygon"), (), {"vendor": 3}),
    ],
)
def test_filters_and_reasons(req: PodRequest, eligible: tuple[str, ...], rejected: Mapping[str, int]) -> None:
    found = place(req, filter_cluster(), PlacementContext())
    base = {"unschedulable": 1, "gpu-count": 1} if req.vendor == "nvidia" else {"vendor": 2}
    expected = dict(base)
    for reason, count in rejected.items():
        expected[reason] = expected.get(reason, 0) + count
    assert found.eligible == eligible
    assert dict(found.rejected) == expected
    assert nodes_of(found.options) == list(eligible)


def test_uuid_lists_choose_the_gpu() -> None:
    index = filter_cluster()
    only = place(request(1, uuids_include=("GPU-p-3",)), index, PlacementContext()).best
    assert only is not None and (only.node, only.gpus) == ("p", (3,))
    avoid = place(request(1, models_include=("t4",), uuids_exclude=("GPU-t-0",)), index, PlacementContext()).best
    assert avoid is not None and (avoid.node, avoid.gpus) == ("t", (1,))


def test_exclusive_and_shared_cards() -> None:
    card = 15360
    usage = {"t": NodeUsage((held(card), GpuUsage(1536, 10, 1), GpuUsage(), GpuUsage()), gpu_tasks=2)}
    index = NodeIndex.build(cluster(pcie_box("t")), usage)
    whole = place(request(1), index, PlacementContext()).best
    assert whole is not None and whole.gpus == (2,) and (whole.memory_mib, whole.cores) == (card, 100)
    shared = place(request(1, memory_pct=25, cores=25), index, PlacementContext()).best
    assert shared is not None and shared.gpus == (1,)  # the held card is never shared; binpack picks GPU 1
    three = place(request(3), index, PlacementContext())
    assert (three.eligible, three.options, dict(three.rejected)) == (("t",), (), {"busy": 1})
    cores = place(request(3, cores=95, memory_mib=100), index, PlacementContext())
    assert cores.options == () and dict(cores.rejected) == {"busy": 1}  # GPU 1 has 90 % of cores left
    assert place(request(2, cores=90, memory_mib=100), index, PlacementContext()).best is not None


def test_host_cpu_and_memory_now() -> None:
    index = NodeIndex.build(cluster(pcie_box("t")), {"t": NodeUsage(cpu_milli=31_000, memory_mib=100_000)})
    found = place(request(1, cpu_milli=2_000), index, PlacementContext())
    assert (found.eligible, found.options, dict(found.rejected)) == (("t",), (), {"cpu": 1})
    found = place(request(1, memory_mib_host=30_000), index, PlacementContext())
    assert (found.eligible, found.options, dict(found.rejected)) == (("t",), (), {"host-memory": 1})


def cpu_pod(cpu: int, memory: int = 0) -> PodRequest:
    return PodRequest("team", "cpu", cpu_milli=cpu, memory_mib_host=memory)


def test_pod_without_gpus_goes_where_its_cpu_and_memory_fit() -> None:
    base = filter_cluster()
    index = base.updated({"p": NodeUsage(cpu_milli=50_000), "d": NodeUsage(cpu_milli=160_000)})
    found = place(cpu_pod(40_000), index, PlacementContext())
    # t (32 cores) never could; d (32 cores left) cannot now; GPU-less nodes are candidates.
    assert found.eligible == ("cpu-only", "d", "p")
    assert dict(found.rejected) == {"unschedulable": 1, "cpu": 2}
    assert nodes_of(found.options) == ["p", "cpu-only"]  # binpack: the fuller node first
    assert all(o.gpus == () and o.topology is TopologyClass.SINGLE for o in found.options)
    assert nodes_of(place(cpu_pod(40_000), index, PlacementContext(policy="spread")).options) == ["cpu-only", "p"]
    memory = place(cpu_pod(1_000, 300_000), index, PlacementContext())
    assert memory.eligible == ("d", "p") and dict(memory.rejected) == {"unschedulable": 1, "host-memory": 2}


@pytest.mark.parametrize("policy", ["random", "best-fit", "dot-product", "binpack", "spread", "fewest-tasks"])
def test_every_policy_places_a_pod_without_gpus_only_where_it_fits(policy: str) -> None:
    index = filter_cluster().updated({"d": NodeUsage(cpu_milli=160_000)})
    found = place(cpu_pod(40_000), index, PlacementContext(policy=policy))
    assert sorted(nodes_of(found.options)) == ["cpu-only", "p"]


def test_fragmentation_scores_a_pod_without_gpus_by_the_fragmentation_its_cpu_causes() -> None:
    nodes = cluster(pcie_box("t1"), pcie_box("t2", cpu=64_000))
    index = NodeIndex.build(nodes, {})
    mix = (WorkloadShape(gpus=1, milli=500, cpu_milli=4_000),)
    pod = cpu_pod(16_000)
    found = place(pod, index, PlacementContext(policy="fragmentation", workload_mix=mix))
    # On t1 the 16 cores left host four such half-card tasks where four cards are free: half the node is
    # stranded once filled (the filled view, weighed by FILLED); the best-fit term counts the 4 free cards.
    assert nodes_of(found.options) == ["t2", "t1"]
    for option in found.options:
        before = index.usage(option.node)
        after = commit(before, option, pod, nodes[option.node])
        assert option.score == -fragmentation_delta(nodes[option.node], before, after, mix)
    assert [round(o.score, 6) for o in found.options] == [round(-4 * TIE_BREAK, 6),
                                                          round(-FILLED * 2.0 - 4 * TIE_BREAK, 6)]
    assert nodes_of(place(pod, index, PlacementContext()).options) == ["t1", "t2"]  # binpack: a tie, by name


def test_a_gpu_pod_asking_for_zero_gpus_gets_no_option() -> None:
    found = place(request(0), filter_cluster(), PlacementContext())
    assert (found.eligible, found.options, dict(found.rejected)) == ((), (), {})


def test_commit_of_a_pod_without_gpus_takes_cpu_and_memory_only() -> None:
    node = pcie_box("t")
    index = NodeIndex.build(cluster(node), {})
    pod = cpu_pod(30_000, 100_000)
    best = place(pod, index, PlacementContext()).best
    assert best is not None and best.gpus == ()
    after = commit(index.usage("t"), best, pod, node)
    assert after == NodeUsage((GpuUsage(),) * 4, cpu_milli=30_000, memory_mib=100_000, gpu_tasks=0)
    index.apply("t", after)
    assert place(pod, index, PlacementContext()).best is None
    # The GPUs are all free, but the node has 2 cores left.
    assert dict(place(request(1, cpu_milli=4_000), index, PlacementContext()).rejected) == {"cpu": 1}
    assert place(request(4, cpu_milli=2_000), index, PlacementContext()).best is not None


# -- commit and the index ---------------------------------------------------------------------------------


def test_commit_counts_memory_cores_tasks_and_host_resources() -> None:
    node = paired("p")
    shared = request(1, memory_mib=10240, cores=30, cpu_milli=1500, memory_mib_host=4096)
    option = Option("p", (3,), 10240, 30, TopologyClass.SINGLE, 0.0, 1.0)
    after = commit(NodeUsage(), option, shared, node)
    assert after.gpus[3] == GpuUsage(10240, 30, 1, False) and after.gpus[0] == GpuUsage()
    assert (after.cpu_milli, after.memory_mib, after.gpu_tasks) == (1500, 4096, 1)
    whole = Option("p", (0, 1), 40960, 100, TopologyClass.NVLINK, 0.03, 1.0)
    again = commit(after, whole, request(2, cpu_milli=500), node)
    assert again.gpus[:2] == (GpuUsage(40960, 100, 1, True),) * 2 and again.gpus[3] == after.gpus[3]
    assert (again.cpu_milli, again.memory_mib, again.gpu_tasks) == (2000, 4096, 2)
    assert nodes_of((option,)) == ["p"] and A100 in node.gpu_model


def test_updated_is_copy_on_write_and_apply_matches_a_rebuild() -> None:
    nodes = cluster(*(dgx(f"d{i}") for i in range(4)), paired("p"))
    base = NodeIndex.build(nodes, {})
    change = NodeUsage((held(H100_CARD),) + (GpuUsage(),) * 7, gpu_tasks=1)
    newer = base.updated({"d2": change})
    assert base.usage("d2") == NodeUsage((GpuUsage(),) * 8) and newer.usage("d2") == change
    assert base.class_count() == 2 and newer.class_count() == 3
    best_before = place(request(1), base, PlacementContext()).best
    best_after = place(request(1), newer, PlacementContext()).best
    assert best_before is not None and best_after is not None
    assert (best_before.node, best_after.node) == ("d0", "d2")  # binpack goes to the used node
    base.apply("d2", change)
    rebuilt = NodeIndex.build(nodes, {"d2": change})
    assert [base.usage(n) for n in nodes] == [rebuilt.usage(n) for n in nodes] == [newer.usage(n) for n in nodes]
    with pytest.raises(KeyError, match="unknown node 'nope'"):
        base.apply("nope", change)


def test_index_of_memoises_on_the_snapshot() -> None:
    snapshot = Snapshot(nodes=cluster(dgx("d")), usage={})
    first = index_of(snapshot)
    assert index_of(snapshot) is first and snapshot.derived.index is first
    assert len(first) == 1 and first.nodes["d"].name == "d"
