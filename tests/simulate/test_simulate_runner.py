"""The trial runner: one process per trial, errors and lost processes reported, not waited on forever."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

from webhook.core.domain.model import Gpu, Node
from webhook.simulate import runner
from webhook.simulate.replay import Run
from webhook.simulate.trace import TracePod

NODES = [Node(name=f"n-{i}", gpus=(Gpu(index=0, uuid=f"GPU-{i}", model="T4", memory_mib=16000),),
              cpu_milli=8000, memory_mib=32768) for i in range(3)]
PODS = [TracePod(name=f"p-{i}", cpu_milli=1000, memory_mib=1024, gpus=1, milli=500)
        for i in range(4)]


def test_parallel_runs_match_runs_in_this_process() -> None:
    alone = runner.run_trials(NODES, PODS, ["fragmentation", "best-fit"], [1, 2, 3], 1.3, jobs=1, show_progress=False)
    parallel = runner.run_trials(NODES, PODS, ["fragmentation", "best-fit"], [1, 2, 3], 1.3, jobs=2,
                                 show_progress=False)
    assert [(r.policy, r.seed) for r in parallel] == [(p, s) for p in ("fragmentation", "best-fit") for s in (1, 2, 3)]
    assert [(r.arrived, r.allocated, r.failed) for r in parallel] == [(r.arrived, r.allocated, r.failed) for r in alone]


def _failing(nodes: Sequence[Node], pods: Sequence[TracePod], arrivals: Sequence[TracePod], trial: runner.Trial,
             progress: object) -> Run:
    raise ValueError(f"no room for seed {trial.seed}")


def _dying(nodes: Sequence[Node], pods: Sequence[TracePod], arrivals: Sequence[TracePod], trial: runner.Trial,
           progress: object) -> Run:
    os._exit(3)


def test_an_error_in_a_worker_is_raised_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_replay", _failing)  # the forked workers inherit it
    with pytest.raises(ValueError, match="no room for seed"):
        runner.run_trials(NODES, PODS, ["best-fit"], [1, 2], 1.3, jobs=2, show_progress=False)


def test_a_worker_that_dies_is_an_error_not_a_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_replay", _dying)
    with pytest.raises(RuntimeError, match="best-fit seed [12] ended with exit code 3 and no result"):
        runner.run_trials(NODES, PODS, ["best-fit"], [1, 2], 1.3, jobs=2, show_progress=False)
