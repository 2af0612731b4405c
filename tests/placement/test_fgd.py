"""The FGD paper's own measure and placement (webhook/core/placement/fgd.py), on cases computed by hand, and the
`fgd` baseline in `simulate`."""

from __future__ import annotations

import math

import pytest

from webhook.commands.simulate import parse_policies
from webhook.core.placement.fgd import FgdCluster, Kind, Task, accessible, fragmentation, packed, score, typical_kinds
from webhook.simulate.report import as_text, summarize, workload_of
from webhook.simulate.runner import run_trials
from webhook.simulate.trace import TracePod, make_node

SHARE = Kind(cpu_milli=1000, milli=500, gpus=1, models=(), weight=0.5)
PAIR = Kind(cpu_milli=1000, milli=1000, gpus=2, models=(), weight=0.25)
CPU_ONLY = Kind(cpu_milli=0, milli=0, gpus=0, models=(), weight=0.25)


def test_fragmentation_counts_what_each_kind_cannot_use() -> None:
    free = (1000, 500, 200, 0)  # 1,700 thousandths free
    # SHARE fits (two GPUs have 500): only the 200 below its share counts -> 0.5 x 200 = 100.
    # PAIR needs two free cards, there is one -> 0.25 x 1700 = 425.
    # CPU_ONLY uses no GPU: all of it counts -> 0.25 x 1700 = 425.
    assert fragmentation("V100", free, 8000, (SHARE, PAIR, CPU_ONLY)) == pytest.approx(950)
    # Too little CPU for SHARE (Q4): all its free capacity counts -> 850 + 425 + 425.
    assert fragmentation("V100", free, 500, (SHARE, PAIR, CPU_ONLY)) == pytest.approx(1700)
    # A kind that asks for another model has no access: all of it counts.
    t4 = Kind(1000, 500, 1, ("T4",), 1.0)
    assert fragmentation("V100", free, 8000, (t4,)) == pytest.approx(1700)
    assert fragmentation("T4", free, 8000, (t4,)) == pytest.approx(200)
    assert fragmentation("V100", (0, 0), 8000, (SHARE, PAIR)) == 0.0


def test_gpu_models_match_exactly_and_a_pod_naming_none_takes_any() -> None:
    assert accessible("V100M16", ("V100M16", "V100M32"))
    assert not accessible("V100M16", ("V100",))
    assert accessible("T4", ())


def test_the_score_is_the_scheduler_plugins_integer() -> None:
    assert score(1000.0, 1000.0) == 50
    assert score(0.0, 1000.0) == int(100 / (1 + math.e))  # 26: one GPU more fragmented
    assert score(1000.0, 0.0) == 73
    assert score(0.0, 30.0) == 49  # 0.03 GPU is under one point: such nodes tie


def test_packed_takes_the_fullest_gpus_that_fit() -> None:
    assert packed((1000, 300, 1000, 600), 500, 2) == (500, 300, 1000, 100)
    assert packed((1000, 300, 1000, 600), 1000, 2) == (0, 300, 0, 600)
    assert packed((1000, 300), 1000, 2) is None


def test_typical_kinds_cover_95_percent_most_frequent_first_renormalised() -> None:
    tasks = [Task(1000, 1000, 1)] * 60 + [Task(2000, 500, 1)] * 30 + [Task(0, 0, 0)] * 6 + [Task(8000, 1000, 8)] * 4
    kinds = typical_kinds(tasks)
    # 60 + 30 = 90 < 95, so the third kind is kept too (96); the fourth is cut, the rest sum to 1.
    assert [(k.cpu_milli, k.milli, k.gpus) for k in kinds] == [(1000, 1000, 1), (2000, 500, 1), (0, 0, 0)]
    assert [k.weight for k in kinds] == pytest.approx([60 / 96, 30 / 96, 6 / 96])
    # Equal counts: the larger demand first (the reference's descending order), so the cut is stable.
    tied = typical_kinds([Task(1000, 500, 1), Task(3000, 500, 1)], popularity=50)
    assert [k.cpu_milli for k in tied] == [3000]
    assert typical_kinds([]) == ()


def test_a_shared_pod_goes_to_the_gpu_that_fragments_least() -> None:
    whole = (Kind(0, 1000, 1, (), 1.0),)
    cluster = FgdCluster([("n1", "V100", 2, 32000, 10**6)], whole)
    cluster.place(Task(0, 500, 1))  # one card half taken: (500, 1000)
    # A second half goes on the half card: (0, 1000) keeps a whole card; on the whole card, neither is.
    assert cluster.place(Task(0, 500, 1)) == "n1"
    assert sorted(cluster.where["n1"].free) == [0, 1000]


def test_the_node_where_fragmentation_grows_least_wins() -> None:
    whole = (Kind(0, 1000, 1, (), 1.0),)
    cluster = FgdCluster([("a", "V100", 2, 32000, 10**6), ("b", "V100", 2, 32000, 10**6)], whole)
    first = cluster.place(Task(0, 300, 1))
    # The second 300 goes beside the first: on the other node it would strand a second card.
    assert cluster.place(Task(0, 300, 1)) == first


def test_ties_go_to_the_first_node_by_name_as_the_reference_scheduler_breaks_them() -> None:
    cluster = FgdCluster([("b", "V100", 8, 96000, 10**6), ("a", "V100", 8, 96000, 10**6)], (SHARE, PAIR))
    assert cluster.place(Task(1000, 1000, 1)) == "a"  # two empty nodes score alike
    assert cluster.place(Task(1000, 1000, 1)) == "a"  # 7 or 8 free cards fragment alike (0): "a" again


def test_cpu_memory_and_models_filter() -> None:
    nodes = [("small-cpu", "V100", 8, 4000, 10**6), ("small-mem", "V100", 8, 64000, 1000),
             ("t4", "T4", 8, 64000, 10**6)]
    cluster = FgdCluster(nodes, (SHARE,))
    assert cluster.place(Task(8000, 1000, 1, memory_mib=2000)) == "t4"
    assert cluster.place(Task(8000, 1000, 1, ("V100",), memory_mib=2000)) is None
    # CPU only: any model, but still CPU and memory: small-cpu lacks the CPU, small-mem the memory.
    assert cluster.place(Task(5000, 0, 0, memory_mib=500_000)) == "t4"


def test_fgd_is_a_simulate_policy_with_the_papers_figure_beside_it() -> None:
    assert parse_policies(["fgd"]) == ["fgd"] and "fgd" in parse_policies(["all"])
    nodes = [make_node(f"n{i}", 32000, 262144, 4, "V100M32") for i in range(4)]
    pods = [TracePod(f"p{i}", 2000, 4096, 1, (250, 500, 1000)[i % 3]) for i in range(30)]
    pods += [TracePod("cpu", 4000, 4096, 0, 0), TracePod("pair", 8000, 4096, 2, 1000)]
    runs = run_trials(nodes, pods, ["fgd", "best-fit"], [1, 2], 1.3, jobs=1, show_progress=False)
    assert [(r.policy, r.seed) for r in runs] == [("fgd", 1), ("fgd", 2), ("best-fit", 1), ("best-fit", 2)]
    fgd = runs[0]
    assert fgd.pods == runs[2].pods and fgd.arrived[-1] == runs[2].arrived[-1]  # the same arrivals
    assert fgd.allocated[-1] <= fgd.capacity_milli and fgd.unallocated_pct(100) is not None
    summary = summarize(runs, 1.3, "openb_pod_list_default.csv")
    assert summary["paperFgd"] == {"workload": "default", "unallocatedPctAt100": 4.77}
    assert "FGD paper's published figure (default): 4.77" in as_text(summary)
    assert "paperFgd" not in summarize(runs, 1.3, "pods.csv")
    assert workload_of("openb_pod_list_multigpu30.csv") == "multigpu30"
