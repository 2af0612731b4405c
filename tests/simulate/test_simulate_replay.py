"""The FGD procedure: resampling to tune x capacity, determinism per seed, no over-commitment, the metric."""

from __future__ import annotations

from array import array
from collections import Counter

import pytest

import webhook.simulate.replay as replay_module
from webhook.core.domain.model import GpuUsage, NodeUsage
from webhook.core.placement.context import POLICIES
from webhook.simulate.replay import InvariantError, Run, capacity_milli, empty_usage, overcommitted, replay, workload
from webhook.simulate.trace import TracePod, make_node

NODES = [
    make_node("g2-a", 96000, 393216, 8, "G2"),
    make_node("g2-b", 96000, 393216, 8, "G2"),
    make_node("t4-a", 104000, 524288, 2, "T4"),
    make_node("t4-b", 104000, 524288, 2, "T4"),
    make_node("p100", 16000, 122880, 2, "P100"),
    make_node("v100", 8000, 32768, 1, "V100M16"),
]
CAPACITY = 23_000

PODS = [
    TracePod("whole", 12000, 16384, 1, 1000),
    TracePod("big-share", 6000, 12288, 1, 810),
    TracePod("half", 6000, 12288, 1, 470),
    TracePod("third", 4000, 8192, 1, 320),
    TracePod("small", 2000, 4096, 1, 160),
    TracePod("pair", 16000, 65536, 2, 1000),
    TracePod("four", 32000, 131072, 4, 1000),
    TracePod("eight", 64000, 262144, 8, 1000),
    TracePod("cpu-only", 8000, 16384, 0, 0),
    TracePod("v100-only", 4000, 8192, 1, 500, ("V100M16", "V100M32")),
]


def total(pods: list[TracePod]) -> int:
    return sum(p.gpu_milli for p in pods)


def test_capacity_counts_healthy_gpus_in_thousandths() -> None:
    assert capacity_milli(NODES) == CAPACITY


def test_topping_up_keeps_the_whole_trace_and_stops_below_the_target() -> None:
    arrivals = workload(PODS, CAPACITY, seed=42, tune=1.3)
    assert Counter(arrivals[: len(PODS)]) == Counter(PODS)  # the trace itself, shuffled
    assert total(arrivals) <= 1.3 * CAPACITY
    # Resampling stopped at the first draw that would have passed the target.
    assert total(arrivals) > 1.3 * CAPACITY - max(p.gpu_milli for p in PODS)
    assert all(p in PODS for p in arrivals[len(PODS) :])


def test_trimming_drops_random_pods_until_the_target_is_met() -> None:
    many = PODS * 20
    arrivals = workload(many, CAPACITY, seed=7, tune=1.0)
    assert total(arrivals) <= CAPACITY < total(many)
    assert not Counter(arrivals) - Counter(many)  # a sub-multiset: nothing new, nothing repeated


def test_arrivals_are_deterministic_per_seed() -> None:
    assert workload(PODS, CAPACITY, 42) == workload(PODS, CAPACITY, 42)
    assert workload(PODS, CAPACITY, 42) != workload(PODS, CAPACITY, 43)


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_never_overcommits_and_is_deterministic(policy: str) -> None:
    arrivals = workload(PODS * 3, CAPACITY, seed=42, tune=1.3)
    first = replay(NODES, arrivals, policy, 42, check=True)
    second = replay(NODES, arrivals, policy, 42, check=True)
    assert (first.arrived, first.allocated, first.failed) == (second.arrived, second.allocated, second.failed)
    assert first.arrived[-1] == total(arrivals)
    assert all(a >= u for a, u in zip(first.arrived, first.allocated, strict=True))
    assert max(first.allocated) <= CAPACITY
    assert first.failed > 0  # 130 % arrived cannot all fit


def test_the_invariant_check_catches_an_overcommitting_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    real_commit = replay_module.commit

    def doubled(usage: NodeUsage, option, request, node):  # type: ignore[no-untyped-def]
        after = real_commit(usage, option, request, node)
        return real_commit(after, option, request, node)

    monkeypatch.setattr(replay_module, "commit", doubled)
    with pytest.raises(InvariantError, match=r"pod whole \(1\): .*: GPU \d: cores 200 > 100"):
        replay(NODES, [PODS[0]], "binpack", 1, check=True)


def test_a_pod_that_fits_nowhere_fails_and_is_not_retried() -> None:
    node = make_node("only", 32000, 65536, 1, "T4")
    pods = [TracePod("a", 1000, 10, 1, 1000), TracePod("b", 1000, 10, 1, 1000), TracePod("c", 1000, 10, 1, 1000)]
    run = replay([node], pods, "binpack", 1)
    assert run.failed == 2
    assert list(run.arrived) == [1000, 2000, 3000]
    assert list(run.allocated) == [1000, 1000, 1000]


def test_cpu_and_memory_of_the_node_constrain_placement() -> None:
    node = make_node("small", 4000, 8192, 2, "T4")
    pods = [
        TracePod("too-much-cpu", 5000, 10, 1, 1000),
        TracePod("too-much-memory", 1000, 9000, 1, 1000),
        TracePod("fits", 3000, 8000, 1, 1000),
        TracePod("no-cpu-left", 2000, 10, 1, 500),
    ]
    run = replay([node], pods, "binpack", 1)
    assert list(run.allocated) == [0, 0, 1000, 1000]
    assert run.failed == 3


def test_gpu_model_constraint_is_honoured() -> None:
    pods = [TracePod("v100-only", 1000, 10, 1, 1000, ("V100M16",)), TracePod("again", 1000, 10, 1, 1000, ("V100M16",))]
    run = replay(NODES, pods, "spread", 1, check=True)
    assert list(run.allocated) == [1000, 1000]
    assert run.failed == 1  # the one V100M16 card is taken


def test_shared_cards_are_filled_up_to_their_capacity_and_no_further() -> None:
    node = make_node("one", 32000, 65536, 1, "T4")
    pods = [TracePod(f"s{i}", 100, 10, 1, 300) for i in range(4)]
    run = replay([node], pods, "best-fit", 1, check=True)
    assert list(run.allocated) == [300, 600, 900, 900]


def test_unallocated_percentage_interpolates_between_pods() -> None:
    run = Run("p", 1, 1000, array("q", [500, 1000, 1500]), array("q", [500, 500, 1000]), 1, 0.1)
    assert run.unallocated_pct(0) == 100.0
    assert run.unallocated_pct(25) == 75.0  # between (0, 0) and (500, 500)
    assert run.unallocated_pct(75) == 50.0  # the second pod failed: flat
    assert run.unallocated_pct(100) == 50.0
    assert run.unallocated_pct(125) == 25.0
    assert run.unallocated_pct(150) == 0.0
    assert run.unallocated_pct(151) is None  # never arrived


def test_overcommitted_reports_each_dimension() -> None:
    node = make_node("n", 1000, 1000, 2, "T4")
    usage = NodeUsage(
        gpus=(GpuUsage(memory_mib=20000, cores=120, tasks=2, exclusive=True), GpuUsage()),
        cpu_milli=2000,
        memory_mib=2000,
    )
    assert overcommitted(node, usage) == [
        "n: GPU 0: cores 120 > 100",
        "n: GPU 0: memory 20000 > 16000 MiB",
        "n: GPU 0: held exclusively by 2 tasks",
        "n: cpu 2000 > 1000 millicores",
        "n: memory 2000 > 1000 MiB",
    ]
    assert overcommitted(node, empty_usage(node)) == []


def test_pods_asking_for_no_gpu_are_never_counted_as_failed_gpu_pods() -> None:
    node = make_node("n", 4000, 8192, 1, "T4")
    run = replay([node], [TracePod("too-big", 8000, 10, 0, 0), TracePod("gpu", 1000, 10, 1, 1000)], "binpack", 1)
    assert (run.failed, run.unplaced_cpu_only) == (0, 1)
    assert list(run.arrived) == [0, 1000]
    assert list(run.allocated) == [0, 1000]


def test_a_pod_asking_for_no_gpu_takes_cpu_that_gpu_pods_then_lack() -> None:
    node = make_node("n", 4000, 8192, 2, "T4")
    pods = [
        TracePod("cpu-only", 3000, 4096, 0, 0),
        TracePod("gpu", 2000, 10, 1, 1000),
        TracePod("small", 1000, 10, 1, 500),
    ]
    run = replay([node], pods, "fragmentation", 1, check=True)
    assert (run.failed, run.unplaced_cpu_only) == (1, 0)  # 1 core left after the CPU-only task
    assert list(run.arrived) == [0, 1000, 1500]
    assert list(run.allocated) == [0, 0, 500]


def test_pods_asking_for_no_gpu_prefer_gpu_less_nodes_under_fragmentation() -> None:
    nodes = [make_node("gpu", 8000, 8192, 2, "T4"), make_node("host", 8000, 8192, 0, "")]
    pods = [TracePod("cpu-only", 6000, 4096, 0, 0), TracePod("a", 4000, 10, 1, 1000), TracePod("b", 4000, 10, 1, 1000)]
    run = replay(nodes, pods, "fragmentation", 1, check=True)
    assert (run.failed, run.unplaced_cpu_only) == (0, 0)
    assert list(run.allocated) == [0, 1000, 2000]
