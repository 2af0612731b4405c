"""The topology-quality benchmark on a tiny cluster: every achievable all-NVLink placement is taken."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def quality() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("topology_quality", BENCHMARKS / "topology_quality.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["topology_quality"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_product_policies_take_every_achievable_nvlink_set(quality: ModuleType) -> None:
    nodes = quality.build_cluster(nvswitch=1, paired=1, pcie=1)
    arrivals = quality.stream(120, seed=1)
    for policy in ("binpack", "fragmentation", "spread"):
        outcome = quality.run(nodes, arrivals, policy, blind=False)
        assert outcome.multi > 20 and outcome.achievable > 10, policy
        assert outcome.nvlink == outcome.achievable, policy
        assert outcome.gap <= 0.01, policy


def test_topology_blind_baseline_misses_nvlink_sets(quality: ModuleType) -> None:
    # The measure can fail: first-fit GPUs on the same cluster and stream miss achievable NVLink sets.
    nodes = quality.build_cluster(nvswitch=1, paired=1, pcie=1)
    outcome = quality.run(nodes, quality.stream(120, seed=1), "binpack", blind=True)
    assert outcome.nvlink < outcome.achievable and outcome.gap > 0.01
